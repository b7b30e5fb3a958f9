"""torchrun worker for the fast tier: 4 ranks as two "nodes" of two (GROUP_RANK and a fast
tier root per node), FSDP2 over all four. Trains steps 1-4 with a snapshot every 2 steps
(each replicated to the same local rank of the other node), then restores into freshly
initialised models after each fault the scenario list applies, in order, and rank 0 writes
what each restore did and whether the state equals the trained one at that step.

    torchrun --standalone --nproc-per-node 4 -m tests.checkpoint.fast_worker OUT
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from fm_pipeline.checkpoint.fast_tier import FastTier
from fm_pipeline.resilience.injectors import flip_byte
from tests.checkpoint.dist_worker import FULL, build
from tests.checkpoint.tiny import tiny_job

RUN = "run-1"
TOPOLOGY = "world4:fsdp4"


def full_state(trainer) -> dict:
    """Copies (the optimizer's scalar `step` tensors are not DTensors: returned as they are,
    and later steps would increment them in place)."""
    state = {"model": get_model_state_dict(trainer.model, options=FULL),
             "optimizer": get_optimizer_state_dict(trainer.model, trainer.opt, options=FULL)}
    return torch.utils._pytree.tree_map(
        lambda v: v.clone() if isinstance(v, torch.Tensor) else v, state)


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def rank_dir(out: Path, node: int, kind: str, rank: int) -> Path:
    return out / f"node-{node}" / "fast-test" / RUN / kind / f"rank-{rank:05d}"


def faults(out: Path):
    """(name, what rank 0 does to the files before the restore), applied cumulatively."""
    yield "intact", lambda: None
    yield "corrupt-own", lambda: flip_byte(rank_dir(out, 0, "own", 1) / "step-00000004.snap")
    yield "node-1-lost", lambda: shutil.rmtree(out / "node-1")
    yield "both-lost", lambda: shutil.rmtree(rank_dir(out, 0, "held", 2))


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.environ["GROUP_RANK"] = str(rank // 2)  # two nodes of two ranks
    root = out / f"node-{rank // 2}"
    job = tiny_job("fast-test", parallelism={"dp_shard": 4, "nproc_per_node": 4},
                   memory_every_steps=2)
    _, _, trainer = build(4)
    fast = FastTier(job, trainer.app_state, topology=TOPOLOGY, run_id=RUN, root=root)
    trained = {}
    for step in (1, 2, 3, 4):
        trainer.step(step, rank)
        if fast.due(step):
            fast.snapshot(step, tokens_seen=step * 32)
            trained[step] = full_state(trainer)
    fast.close()
    report = {"snapshot": fast.report(), "peers": fast.peers, "restores": {}}
    for i, (name, fault) in enumerate(faults(out)):
        if rank == 0:
            fault()
        dist.barrier()
        torch.manual_seed(100 + i)  # a model that is not the trained one
        _, _, fresh = build(4, seed=100 + i)
        tier = FastTier(job, fresh.app_state, topology=TOPOLOGY, run_id=RUN, root=root)
        restored = tier.restore()
        state = full_state(fresh)
        tier.close()
        if rank == 0:
            report["restores"][name] = None if restored is None else {
                "step": restored.step, "tier": restored.tier, "from_peer": restored.from_peer,
                "skipped": restored.skipped, "cursor": fresh.cursor.samples_consumed,
                "equal": equal(state, trained[restored.step])}
            if restored is None:
                report["restores"][name] = {"none": tier.last_skipped}
    if rank == 0:
        (out / "report.json").write_text(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
