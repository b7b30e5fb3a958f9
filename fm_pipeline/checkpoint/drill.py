"""Restore drill: prove a checkpoint restores, on a different topology than it was written.

    python -m fm_pipeline.checkpoint.drill --checkpoint .fm/runs/demo/checkpoints/step-00000020
    result = run_restore_drill(ref)             # from Python (the Dagster asset check uses this)

Picks a drill topology (pp swapped for dp, else half the ranks, else two ranks for a
single-process checkpoint), launches `torchrun -m fm_pipeline.checkpoint.drill_worker`,
and records pass/fail, the reasons, restore time and bytes/s in `marks/drill.json` next to
the manifest (both tiers when the checkpoint came from the store). Retention keeps
drill-passed checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fm_pipeline.catalog.manifest import Manifest, now_iso
from fm_pipeline.catalog.refs import CheckpointRef
from fm_pipeline.catalog.validate import (
    CheckpointInvalid,
    model_problems,
    read_manifest,
    validate,
)
from fm_pipeline.rundir.torchrun import torchrun_executable

_RESET = {"nnodes": 1, "dp_replicate": 1, "dp_shard": -1, "tp": 1, "pp": 1, "ep": 1,
          "pp_schedule": "1F1B", "pp_virtual_stages": 1, "pp_microbatches": None,
          "pp_layers_per_stage": None}


@dataclass
class DrillResult:
    passed: bool
    checkpoint: str
    step: int = -1
    source_topology: str = ""
    drill_topology: str = ""
    world_size: int = 0
    reasons: list[str] = field(default_factory=list)
    checks: dict = field(default_factory=dict)
    restore_s: float = 0.0
    verify_s: float = 0.0
    load_s: float = 0.0
    download_s: float = 0.0
    bytes: int = 0
    bytes_per_s: float = 0.0
    wall_s: float = 0.0
    finished_at: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DrillResult":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def summary(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        line = (f"drill {verdict}: step {self.step} written at {self.source_topology}, restored "
                f"at {self.drill_topology} in {self.restore_s:.2f}s "
                f"({self.bytes_per_s / 1e6:.1f} MB/s)")
        return line + "".join(f"\n  - {r}" for r in self.reasons)


def describe_topology(p: dict) -> str:
    """`world 4 (dp_shard 2 x tp 2)` from a manifest's or a spec's parallelism."""
    world = p.get("world_size") or p.get("nnodes", 1) * p.get("nproc_per_node", 1)
    p = dict(p)
    if p.get("dp_shard") == -1:  # a spec's "whatever the other degrees leave"
        p["dp_shard"] = world // (p.get("dp_replicate", 1) * p.get("pp", 1) * p.get("tp", 1))
    degrees = [f"{k} {p[k]}" for k in ("dp_replicate", "dp_shard", "pp", "tp", "ep")
               if p.get(k, 1) > 1]
    return f"world {world} ({' x '.join(degrees) or 'single process'})"


def loss_tolerance(mixed_precision: str) -> float:
    # fp32: only the reduction order changes with the topology; bf16 compute rounds per layer.
    return 1e-4 if mixed_precision == "fp32" else 2e-2


def drill_job(manifest: Manifest, parallelism: dict):
    """The checkpoint's own job spec with the drill's parallelism (validated as usual)."""
    from fm_pipeline.config import parse_job

    spec = dict(manifest.job_spec)
    source = dict(spec.get("parallelism", {}))
    keep = {k: source[k] for k in ("activation_checkpoint", "mixed_precision") if k in source}
    spec["parallelism"] = {**_RESET, **keep, **parallelism}
    return parse_job(spec, source=f"drill of {manifest.job} step {manifest.step}")


def same_topology(a, b) -> bool:
    """Whether two parallelism records (spec or manifest) place the model identically."""
    def signature(p):
        return (p.nnodes * p.nproc_per_node, p.dp_replicate,
                getattr(p, "resolved_dp_shard", p.dp_shard), p.tp, p.pp,
                p.pp_virtual_stages, getattr(p, "ep", 1))
    return signature(a) == signature(b)


def choose_parallelism(manifest: Manifest, *, max_nproc: int | None = None) -> dict:
    """A valid topology different from the one the checkpoint was written with."""
    src = manifest.parallelism
    world = src.world_size
    options = []
    if src.pp > 1:
        options.append({"nproc_per_node": world, "tp": src.tp})  # pp swapped for dp
    if world > 1:
        options.append({"nproc_per_node": world // 2})  # half the ranks, plain FSDP
    options.append({"nproc_per_node": 2})
    options.append({"nproc_per_node": 1})
    tried = []
    for option in options:
        if max_nproc is not None and option["nproc_per_node"] > max_nproc:
            continue
        try:
            job = drill_job(manifest, option)
        except ValueError as e:
            tried.append(f"{option}: {str(e).splitlines()[-1].strip()}")
            continue
        if not same_topology(job.parallelism, src):
            return option
    raise ValueError(f"no drill topology differs from the source's "
                     f"{describe_topology(src.model_dump())}; tried: {'; '.join(tried)}")


def _resolve(checkpoint, store) -> CheckpointRef:
    if isinstance(checkpoint, CheckpointRef):
        return checkpoint
    text = str(checkpoint)
    if store is not None and not Path(text).exists():
        return CheckpointRef.remote(store, text)
    return CheckpointRef.local(text)


def run_restore_drill(checkpoint, *, site, job=None, parallelism: dict | None = None,
                      store=None, max_nproc: int | None = None,
                      timeout_s: float = 900.0) -> DrillResult:
    """Drill one checkpoint (a CheckpointRef, a local directory, or a key prefix in `store`;
    one in the store is fetched into its job's local tier at `site`). Never raises for a bad
    checkpoint: the result says why it failed, and is recorded."""
    from fm_pipeline.catalog.tiering import local_copy

    t0 = time.perf_counter()
    ref = _resolve(checkpoint, store)
    result = DrillResult(passed=False, checkpoint=ref.location, step=ref.step)
    try:
        manifest = read_manifest(ref)
        if job is not None and (problems := model_problems(manifest, job)):
            raise CheckpointInvalid(ref, problems)
        local, result.download_s = local_copy(ref, site=site)
        # Structure and sizes first (cheap); the workers verify every checksum while restoring.
        if problems := validate(local, job, checksums=False):
            raise CheckpointInvalid(local, problems)
        parallelism = parallelism or choose_parallelism(manifest, max_nproc=max_nproc)
        drill_job(manifest, parallelism)  # a bad topology fails here, with field names
    except CheckpointInvalid as e:
        result.reasons = [str(p) for p in e.problems]
        return _record(ref, None, result, t0)
    except (ValueError, FileNotFoundError) as e:
        result.reasons = [str(e)]
        return _record(ref, None, result, t0)
    nproc = parallelism.get("nnodes", 1) * parallelism["nproc_per_node"]
    with tempfile.TemporaryDirectory(prefix="fm-drill-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [*torchrun_executable(), "--standalone",
               f"--nproc-per-node={nproc}", "-m", "fm_pipeline.checkpoint.drill_worker",
               "--checkpoint", str(local.dir), "--out", str(out),
               "--parallelism", json.dumps(parallelism)]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  env=env)
            tail = (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            proc, tail = None, f"timed out after {timeout_s:.0f}s"
        if out.is_file():
            downloaded = result.download_s
            result = DrillResult.from_dict(json.loads(out.read_text()))
            result.download_s = downloaded
            result.checkpoint = ref.location
        else:
            result.reasons = [f"drill workers wrote no result (exit "
                              f"{None if proc is None else proc.returncode}): {tail}"]
    return _record(ref, local, result, t0)


def drill_latest(job, *, site, store=None, max_nproc: int | None = None,
                 force: bool = False) -> DrillResult | None:
    """Drill the job's newest valid checkpoint unless it already has a drill result (the
    schedule's entry point). None when the job has no valid checkpoint yet."""
    from fm_pipeline.catalog.marks import read_mark
    from fm_pipeline.catalog.validate import latest_valid

    found = latest_valid(job, store=store, checksums=False,
                         root=site.checkpoints_dir(job.name)).found
    if found is None or (not force and read_mark(found, "drill") is not None):
        return None
    return run_restore_drill(found, site=site, job=job, store=store, max_nproc=max_nproc)


def _record(ref: CheckpointRef, local: CheckpointRef | None, result: DrillResult,
            t0: float) -> DrillResult:
    from fm_pipeline.catalog.marks import write_mark
    from fm_pipeline.storage import StoreError

    result.wall_s = time.perf_counter() - t0
    result.finished_at = now_iso()
    payload = {k: v for k, v in result.as_dict().items() if k != "checks"} | {
        "checks": {k: v for k, v in result.checks.items() if k != "traceback"}}
    for target in {id(r): r for r in (ref, local) if r is not None}.values():
        try:
            if target.has("manifest.json"):
                write_mark(target, "drill", payload)
        except (OSError, StoreError):
            pass  # the returned result still carries the verdict
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Restore a checkpoint on another topology "
                                                 "and verify it.")
    parser.add_argument("--checkpoint", required=True,
                        help="a step-XXXXXXXX directory, or a key prefix in --store")
    parser.add_argument("--store", default=None, help="object store URI for remote checkpoints")
    parser.add_argument("--nproc", type=int, default=None, help="drill world size (pure FSDP)")
    parser.add_argument("--parallelism", default=None, help="JSON degrees for the drill")
    args = parser.parse_args(argv)
    from fm_pipeline.config.site import Site

    site = Site.from_environ()  # an entry point: `python -m fm_pipeline.checkpoint.drill`
    store = site.open_store(args.store) if args.store else None
    parallelism = json.loads(args.parallelism) if args.parallelism else None
    if args.nproc and parallelism is None:
        parallelism = {"nproc_per_node": args.nproc}
    result = run_restore_drill(args.checkpoint, site=site, store=store, parallelism=parallelism)
    print(result.summary())
    print(json.dumps({k: v for k, v in result.as_dict().items() if k != "checks"}))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
