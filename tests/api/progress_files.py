"""What a training job leaves behind, written the way the trainer and checkpointer do:
a committed checkpoint (manifest per fm_pipeline.catalog.manifest) and metrics lines
(per fm_pipeline.rundir.records)."""

from __future__ import annotations

import json

from fm_pipeline.catalog.manifest import Manifest, Timings, atomic_write, file_entry
from fm_pipeline.catalog.refs import step_dir_name
from tests.local_site import local_root
from tests.local_site import runs_dir


def write_checkpoint(job: str, *, step: int, tokens: int = 0, eval_loss: dict | None = None):
    path = local_root(job) / step_dir_name(step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"weights" * 100)
    manifest = Manifest(
        format="fm-checkpoint/1", job=job, step=step, tokens_seen=tokens or step * 1024,
        created_at="2027-01-15T10:00:00Z", state_keys=["model", "optimizer"],
        parallelism=dict(world_size=16, nnodes=2, nproc_per_node=8, dp_replicate=1, dp_shard=2,
                         tp=4, pp=2, pp_schedule="1F1B", pp_virtual_stages=1,
                         mixed_precision="bf16"),
        model=dict(config={}, hash="abc"), data=dict(global_batch_size=16, seq_len=32),
        code=dict(package_version="0.1.0", torch_version="2.13.0"),
        # every timing the checkpointer records (the set grows): seconds, and async on
        timings={name: True if field.annotation is bool else 0.1
                 for name, field in Timings.model_fields.items()},
        job_spec={}, files=[file_entry(path, "__0_0.distcp")], total_bytes=700,
    )
    atomic_write(path / "manifest.json", manifest.to_json())
    if eval_loss is not None:
        (path / "marks").mkdir()
        (path / "marks" / "eval.json").write_text(json.dumps(
            {"mark": "eval", "written_at": "2027-01-15T10:05:00Z", "loss": eval_loss}))
    return path


def write_step_metrics(job: str, *, steps, step_time_s: float, mfu: float,
                       **extra) -> None:
    """`extra`: more keys of each step record (an MoE job's moe_max_load, ...)."""
    path = runs_dir(job) / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for step in steps:
            f.write(json.dumps({
                "kind": "step", "job": job, "segment": "s1", "time": 1.0 * step, "step": step,
                "loss": 2.5, "step_time_s": step_time_s, "tokens": 512,
                "tokens_per_s": 512 / step_time_s, "mfu": mfu, **extra,
            }) + "\n")
