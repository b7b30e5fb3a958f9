"""torchrun worker for resharding tests: FSDP2-train a tiny model and save (async, over the
checkpoint manager's own gloo group), or restore at another world size; rank 0 dumps the
gathered full model and optimizer state for the test to compare.

    torchrun --standalone --nproc-per-node 4 -m tests.checkpoint.dist_worker save OUT
    torchrun --standalone --nproc-per-node 2 -m tests.checkpoint.dist_worker load OUT 2
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fm_pipeline.checkpoint import CheckpointManager
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True,
                        flatten_optimizer_state_dict=True)


def build(world: int, *, nnodes: int = 1, upload: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    model = TinyLM()
    mesh = None
    if world > 1:  # FSDP2 per block, then the root; a world of 1 keeps a plain module
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        for layer in model.layers.values():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    job = tiny_job(parallelism={"nnodes": nnodes, "nproc_per_node": world // nnodes,
                                "dp_shard": world}, upload=upload)
    return job, mesh, Trainer(model)


def dump(trainer: Trainer, path: Path) -> None:
    model = get_model_state_dict(trainer.model, options=FULL)
    optim = get_optimizer_state_dict(trainer.model, trainer.opt, options=FULL)
    if dist.get_rank() == 0:
        torch.save({"model": model, "optimizer": optim, "cursor": trainer.cursor.state_dict(),
                    "lr_epoch": trainer.sched.last_epoch}, path)


def train_and_save(trainer: Trainer, manager: CheckpointManager, rank: int):
    """Steps 1-3, saving steps 1 and 3 (async); the committed result of step 3."""
    for step in (1, 2, 3):
        trainer.step(step, rank)
        if step in (1, 3):
            manager.save(step, tokens_seen=step * 32, final=step == 3)
    result = manager.close()
    assert result.committed and result.step == 3, result
    return result


def main(mode: str, out: Path, tag: str = "") -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job, mesh, trainer = build(world)
    manager = CheckpointManager(job, trainer.app_state, mesh=mesh, async_save=True, site=local_site.site())
    if mode == "save":
        train_and_save(trainer, manager, rank)
        dump(trainer, out / "source.pt")
    else:
        restored = manager.restore_latest()
        assert restored is not None and restored.step == 3, restored
        manager.close()
        dump(trainer, out / f"loaded-{tag}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
