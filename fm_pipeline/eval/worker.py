"""Held-out evaluation inside one process or torchrun: restore a checkpoint's model, score
every data domain, rank 0 writes the result JSON.

    python -m fm_pipeline.eval.worker --checkpoint .fm/runs/demo/checkpoints/step-00000020 \
        --out eval.json
    torchrun --standalone --nproc-per-node 2 -m fm_pipeline.eval.worker --checkpoint DIR --out f
    python -m fm_pipeline.eval.worker --job configs/demo.yaml --at-init --out eval0.json

(`fm_pipeline.eval.evaluate_checkpoint` launches this for you.) The model is built with the
trainer's own code (`build_parallel_model`) on a plain FSDP mesh of this world size and
restored with the checkpoint package (checksums verified, DCP resharding), so any
checkpoint evaluates on any number of ranks. `--at-init` scores the model as training
initialises it (the job's seed): the baseline a trained checkpoint must beat.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

INVALID_EXIT = 3  # the checkpoint failed its checksums or is of another model

_PARALLELISM_RESET = {"nnodes": 1, "dp_replicate": 1, "dp_shard": -1, "tp": 1, "pp": 1,
                      "pp_schedule": "1F1B", "pp_virtual_stages": 1, "pp_microbatches": None,
                      "pp_layers_per_stage": None}


def eval_job(spec: dict, *, world_size: int):
    """The job spec on a plain FSDP mesh of `world_size` ranks (same model and precision)."""
    from fm_pipeline.config import parse_job

    parallelism = dict(spec.get("parallelism") or {})
    keep = {k: parallelism[k] for k in ("activation_checkpoint", "mixed_precision")
            if k in parallelism}
    return parse_job({**spec, "parallelism": {**_PARALLELISM_RESET, **keep,
                                              "nproc_per_node": world_size}},
                     source=f"evaluation of {spec.get('name')} on {world_size} rank(s)")


def run(*, checkpoints: list[Path], job_path: Path | None, site, max_batches: int,
        batch_size: int | None) -> list[dict]:
    """One result per checkpoint (or one for the initial model): the model is built, and
    torch and the data mix opened, once; each checkpoint is restored into it in turn. A
    checkpoint that fails its checks is reported as {"checkpoint", "invalid"}; the others
    are still scored."""
    import torch.distributed as dist

    from fm_pipeline.catalog import read_manifest
    from fm_pipeline.catalog.refs import CheckpointRef
    from fm_pipeline.checkpoint import ModelState, restore
    from fm_pipeline.config import dump_job, load_job
    from fm_pipeline.data import mix_key, open_mix
    from fm_pipeline.eval.heldout import heldout_losses
    from fm_pipeline.eval.result import EvalResult
    from fm_pipeline.parallel import ParallelDims, build_parallel_model, init_distributed
    from fm_pipeline.catalog import CheckpointInvalid

    t0 = time.perf_counter()
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    refs = [CheckpointRef.local(c) for c in checkpoints]
    if refs:
        manifest = read_manifest(refs[0])
        spec, key = manifest.job_spec, manifest.data.mix
    else:
        spec, key = dump_job(load_job(job_path)), None
    job = eval_job(spec, world_size=world)
    key = key or mix_key(job)
    dims = ParallelDims.from_spec(job.parallelism, world_size=world)
    mesh = dims.build_mesh(device.type)
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=device)
    mix = open_mix(site.store(), key, cache_dir=site.data_cache(key))
    out = []
    for ref in refs or [None]:
        result = EvalResult(job=job.name, step=ref.step if ref else 0,
                            checkpoint=str(ref.dir) if ref else None, world_size=world,
                            topology=dims.describe())
        if ref is not None:
            try:
                restored = restore({"model": ModelState(pm.parts)}, ref, job=job)
            except CheckpointInvalid as e:
                out.append({"checkpoint": str(ref.dir),
                            "invalid": [[p.where, p.message] for p in e.problems]})
                continue
            result.restore_s = restored.seconds
        t1 = time.perf_counter()
        result.domains = heldout_losses(
            pm, mix, dp_rank=dims.dp_rank(rank), dp=dims.dp, max_batches=max_batches,
            # The same windows per batch on any world size: each rank scores whole batches.
            batch_size=batch_size or job.training.micro_batch_size)
        result.eval_s = time.perf_counter() - t1
        result.wall_s = time.perf_counter() - t0  # the first one carries the start-up
        t0 = time.perf_counter()
        out.append(result.to_dict())
    return out


def main(argv: list[str] | None = None) -> None:
    from fm_pipeline.config.site import Site

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", type=Path, action="append",
                      help="a committed step-XXXXXXXX directory (repeat: several, in turn)")
    what.add_argument("--job", type=Path, help="with --at-init: a job spec YAML")
    parser.add_argument("--at-init", action="store_true", help="score the initial model")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--store", default=None, help="object store of the data mix "
                                                      "(default: FM_STORE_URI or <FM_HOME>/store)")
    parser.add_argument("--max-batches", type=int, default=8, help="per domain")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="windows per forward (default: training.micro_batch_size)")
    args = parser.parse_args(argv)
    if args.job is not None and not args.at_init:
        parser.error("--job evaluates the initial model: add --at-init")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist

    from fm_pipeline.catalog import CheckpointInvalid

    code = 0
    try:
        data = {"results": run(checkpoints=args.checkpoint or [], job_path=args.job,
                               site=Site.from_environ().with_store(args.store),
                               max_batches=args.max_batches, batch_size=args.batch_size)}
        if any("invalid" in r for r in data["results"]):
            code = INVALID_EXIT
    except CheckpointInvalid as e:  # reported as data: the caller raises it with the problems
        data = {"invalid": [[p.where, p.message] for p in e.problems]}
        code = INVALID_EXIT
    if not dist.is_initialized() or dist.get_rank() == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.freeze()  # the interpreter's last collections skip torch's objects (see exit_with)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
