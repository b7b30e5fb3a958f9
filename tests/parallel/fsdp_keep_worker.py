"""torchrun worker for test_fsdp_keep_gathered: 3 optimizer steps of the debug model under
FSDP2 on 2 gloo ranks, 4 micro-batches a step, with parallelism.fsdp_keep_gathered off and
then on (two models in one process group: one start-up). Counts FSDP2's all-gathers and
reduce-scatters per step (the collectives it calls, torch.distributed.all_gather_single /
reduce_scatter_single) and writes the losses, counts and final weights to
$OUT/keep<0|1>-rank<r>.pt."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from fm_pipeline.data.testing import small_job
from fm_pipeline.parallel import ParallelDims, build_parallel_model, init_distributed
from torch.distributed.fsdp import FSDPModule

COUNTS = {"all_gather": 0, "reduce_scatter": 0}


def counting(name: str, collective):
    def call(*args, **kwargs):
        COUNTS[name] += 1
        return collective(*args, **kwargs)
    return call


def main(out_dir: str) -> None:
    dist.all_gather_single = counting("all_gather", dist.all_gather_single)
    dist.reduce_scatter_single = counting("reduce_scatter", dist.reduce_scatter_single)
    device = init_distributed()
    for keep in (False, True):
        train(out_dir, keep, device)
    dist.destroy_process_group()


def train(out_dir: str, keep: bool, device) -> None:
    job = small_job(**{"model.size": "debug", "model.vocab_size": 512, "training.seq_len": 32,
                       "training.global_batch_size": 8, "training.micro_batch_size": 1,
                       "parallelism.nproc_per_node": 2,
                       "parallelism.fsdp_keep_gathered": keep})
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = ParallelDims.from_spec(job.parallelism, world_size=world)
    pm = build_parallel_model(job, mesh=dims.build_mesh(device.type), dims=dims, device=device)
    units = sum(isinstance(m, FSDPModule) for m in pm.parts[0].modules())
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-2, foreach=False)
    rows = job.training.global_batch_size // world
    data = torch.randint(0, 512, (3, world, rows, 33), generator=torch.Generator().manual_seed(7))
    losses, per_step = [], []
    for step in range(3):
        before = dict(COUNTS)
        batch = data[step, rank]
        loss = pm.forward_backward(batch[:, :-1], batch[:, 1:])
        optimizer.step()
        optimizer.zero_grad()
        per_step.append({k: COUNTS[k] - before[k] for k in COUNTS})
        losses.append(loss.item())
    weights = {n: p.full_tensor() for n, p in pm.parts[0].named_parameters()}
    torch.save({"losses": losses, "per_step": per_step, "units": units,
                "micro_batches": rows // job.training.micro_batch_size, "weights": weights},
               os.path.join(out_dir, f"keep{int(keep)}-rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
