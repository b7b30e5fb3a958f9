"""The restore drill inside torchrun: restore a checkpoint into another topology and check it.

    torchrun --standalone --nproc-per-node 1 -m fm_pipeline.checkpoint.drill_worker \
        --checkpoint .fm/runs/demo/checkpoints/step-00000020 --out drill.json

(`python -m fm_pipeline.checkpoint.drill` picks the topology and launches this for you.)
Every rank builds the model for the drill topology with a different seed than training,
restores it (checksums verified, DCP resharding), and checks:
  params     every parameter, gathered, bitwise equal to the tensors in the files
  optimizer  every optimizer entry resharded onto the new mesh, gathered, bitwise equal
  loss       the probe batch's loss equal to the one recorded at save time (tolerance)
  cursor     data cursor continuous: samples_consumed x seq_len == tokens_seen, steps agree
Rank 0 writes the result JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fm_pipeline.catalog.manifest import Manifest
from fm_pipeline.catalog.refs import PROBE_FILE, CheckpointRef
from fm_pipeline.catalog.validate import CheckpointInvalid, read_dcp_metadata, read_manifest
from fm_pipeline.checkpoint.drill import (
    DrillResult,
    describe_topology,
    drill_job,
    loss_tolerance,
    same_topology,
)
from fm_pipeline.checkpoint.export import load_full_state
from fm_pipeline.checkpoint.load import restore
from fm_pipeline.checkpoint.state import ModelState


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _optimizer_placeholders(parts, meta) -> dict:
    """Empty tensors shaped and sharded like each saved optimizer entry of this rank's
    parameters, so DCP reshards the optimizer state onto the drill mesh."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = {k[len("optimizer."):]: v for k, v in meta.state_dict_metadata.items()
               if k.startswith("optimizer.state.")}
    out = {}
    for part in parts:
        for fqn, param in part.named_parameters():
            prefix = f"state.{fqn}."
            for key, md in entries.items():
                if not key.startswith(prefix) or "." in key[len(prefix):]:
                    continue
                if not isinstance(md, TensorStorageMetadata):
                    continue
                if tuple(md.size) == tuple(param.shape):
                    out[key] = torch.zeros_like(param, dtype=md.properties.dtype)
                else:  # e.g. AdamW's scalar step: the same on every rank
                    out[key] = torch.zeros(md.size, dtype=md.properties.dtype)
    return out


def _compare(restored: dict, source: dict, what: str) -> dict:
    """Gather each restored tensor (collective over its mesh) and compare bitwise."""
    mismatched = [k for k in sorted(restored)
                  if not torch.equal(_full(restored[k]).cpu(), source[f"{what}.{k}"])]
    return {"compared": len(restored), "mismatched": mismatched[:20],
            "n_mismatched": len(mismatched)}


def _all_ranks_agree(flag: bool) -> bool:
    t = torch.tensor([0 if flag else 1], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() == 0


def _cursor_check(ref: CheckpointRef, manifest: Manifest) -> dict:
    """Data cursor continuity, from the files (not the manifest alone)."""
    state = load_full_state(ref, keys={"dataloader", "train_state"} & set(manifest.state_keys),
                            verify=False)
    loader, train = state.get("dataloader"), state.get("train_state")
    problems = []
    if loader is None:
        problems.append("the checkpoint has no dataloader state")
    else:
        consumed = int(loader.get("samples_consumed", -1))
        if manifest.data.cursor is not None and manifest.data.cursor != loader:
            problems.append(f"manifest data.cursor {manifest.data.cursor} differs from the saved "
                            f"loader state {loader}")
        if consumed * manifest.data.seq_len != manifest.tokens_seen:
            problems.append(
                f"samples_consumed {consumed} x seq_len {manifest.data.seq_len} = "
                f"{consumed * manifest.data.seq_len} != tokens_seen {manifest.tokens_seen}: the "
                "data stream would skip or repeat samples")
    if train is not None and "step" in train and int(train["step"]) != manifest.step:
        problems.append(f"train_state step {train['step']} != manifest step {manifest.step}")
    return {"ok": not problems, "problems": problems,
            "samples_consumed": None if loader is None else loader.get("samples_consumed")}


def _probe_loss(pm, ref: CheckpointRef) -> float | None:
    tokens = torch.load(ref.dir / PROBE_FILE, weights_only=True).to(pm.device)
    loss = pm.loss(tokens[:, :-1], tokens[:, 1:])
    packed = torch.tensor([0.0 if loss is None else float(loss), 0.0 if loss is None else 1.0],
                          dtype=torch.float64)
    dist.all_reduce(packed)
    return packed[0].item() / packed[1].item() if packed[1].item() else None


def run(checkpoint: Path, parallelism: dict | None, *,
        allow_same_topology: bool = False) -> DrillResult:
    from fm_pipeline.parallel import ParallelDims, build_parallel_model, init_distributed

    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = CheckpointRef.local(checkpoint)
    manifest = read_manifest(ref)
    job = drill_job(manifest, parallelism or {"nnodes": 1, "nproc_per_node": world})
    if not allow_same_topology and same_topology(job.parallelism, manifest.parallelism):
        raise ValueError(f"the drill topology equals the source's "
                         f"({describe_topology(manifest.parallelism.model_dump())}): launch "
                         "with another --nproc-per-node or --parallelism")
    result = DrillResult(
        passed=False, checkpoint=str(ref.dir), step=manifest.step,
        source_topology=describe_topology(manifest.parallelism.model_dump()),
        drill_topology=describe_topology(job.parallelism.model_dump() | {"world_size": world}),
        world_size=world, bytes=manifest.total_bytes)
    dims = ParallelDims.from_spec(job.parallelism, world_size=world)
    mesh = dims.build_mesh(device.type)
    # A seed training never used: a restore that silently loaded nothing cannot pass.
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=device,
                              seed=job.training.seed + 7919)
    meta = read_dcp_metadata(ref)
    optim = _optimizer_placeholders(pm.parts, meta)
    t0 = time.perf_counter()
    try:
        restored = restore({"model": ModelState(pm.parts), "optimizer": optim}, ref,
                           job=job)
    except CheckpointInvalid as e:
        result.reasons = [f"checksums/model: {p}" for p in e.problems]
        result.checks["checksums"] = {"ok": False, "problems": [str(p) for p in e.problems]}
        return result
    result.restore_s = time.perf_counter() - t0
    result.verify_s, result.load_s = restored.verify_s, restored.load_s
    result.bytes_per_s = manifest.total_bytes / result.restore_s
    result.checks["checksums"] = {"ok": True, "files": len(manifest.files)}

    model_keys = {f"model.{k}" for part in pm.parts for k in part.state_dict()}
    source = load_full_state(ref, keys=model_keys | {f"optimizer.{k}" for k in optim},
                             verify=False)
    flat = {f"model.{k}": v for k, v in source["model"].items()}
    flat |= {f"optimizer.{k}": v for k, v in source.get("optimizer", {}).items()}
    params = _compare({k: v for part in pm.parts for k, v in part.state_dict().items()},
                      flat, "model")
    optimizer = _compare(optim, flat, "optimizer")
    params["ok"] = _all_ranks_agree(params["n_mismatched"] == 0)
    optimizer["ok"] = _all_ranks_agree(optimizer["n_mismatched"] == 0 and bool(optim))
    result.checks["params"], result.checks["optimizer"] = params, optimizer
    if not params["ok"]:
        result.reasons.append(f"params: {params['n_mismatched']} tensors differ from the files "
                              f"after restore, e.g. {params['mismatched'][:3]}")
    if not optimizer["ok"]:
        result.reasons.append("optimizer: state missing or different after resharding "
                              f"({optimizer['n_mismatched']} of {optimizer['compared']} entries)")

    if manifest.probe is None:
        result.checks["loss"] = {"ok": None, "note": "no probe batch recorded at save time"}
    else:
        got = _probe_loss(pm, ref)
        rtol = loss_tolerance(job.parallelism.mixed_precision)
        ok = got is not None and math.isclose(got, manifest.probe.loss, rel_tol=rtol)
        result.checks["loss"] = {"ok": ok, "expected": manifest.probe.loss, "restored": got,
                                 "rel_tol": rtol}
        if not ok:
            result.reasons.append(f"loss: probe batch loss {got} after restore, "
                                  f"{manifest.probe.loss} at save time (rel_tol {rtol})")
    if rank == 0:
        result.checks["cursor"] = _cursor_check(ref, manifest)
        result.reasons += [f"cursor: {p}" for p in result.checks["cursor"]["problems"]]
    result.passed = not result.reasons
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--parallelism", default=None, help="JSON: the drill's degrees")
    parser.add_argument("--allow-same-topology", action="store_true",
                        help="drill on the source's own topology (no resharding)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        result = run(args.checkpoint, json.loads(args.parallelism) if args.parallelism else None,
                     allow_same_topology=args.allow_same_topology)
    except Exception as e:
        result = DrillResult(passed=False, checkpoint=str(args.checkpoint),
                             reasons=[f"drill crashed: {type(e).__name__}: {e}"],
                             checks={"traceback": traceback.format_exc()[-4000:]})
    if not dist.is_initialized() or dist.get_rank() == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.freeze()  # the interpreter's last collections skip torch's objects (see exit_with)


if __name__ == "__main__":
    main()
