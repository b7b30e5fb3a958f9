"""torchrun worker of benchmarks.moe: the all-to-all's share of an expert-parallel step.

    torchrun --nproc-per-node 2 -m benchmarks.moe_alltoall --model moe-tiny --steps 8

The model is built as the trainer builds it (build_parallel_model: FSDP2 over dp_shard,
experts over ep = world), and each step is the trainer's forward/backward and AdamW step
on random tokens. torch.profiler records the main thread; the all-to-all time is every
`all_to_all_single` op (the count exchange, the dispatch and the combine, forward and
backward) plus the waits on their results, over the profiled steps' wall time (the
profiler's own overhead is in both). Rank 0 prints one JSON object, the mean over ranks.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from fm_pipeline.data.testing import small_job
from fm_pipeline.parallel import ParallelDims, build_parallel_model
from fm_pipeline.train.optimizer import build_optimizer

# The issuing op and the wait on its result, by exact name: the autograd nodes around the
# backward all-to-all contain these same ops and would count them twice. (FSDP2 issues its
# collectives through c10d directly, so these waits are the all-to-alls' only.)
ALLTOALL_OPS = ("_c10d_functional::all_to_all_single", "_c10d_functional::wait_tensor")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="moe-tiny")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    job = small_job(**{"model.size": args.model, "model.vocab_size": 2048,
                       "parallelism.nproc_per_node": world, "parallelism.dp_shard": world,
                       "parallelism.ep": world, "training.seq_len": args.seq_len,
                       "training.global_batch_size": 4 * world,
                       "training.micro_batch_size": 4})
    dims = ParallelDims.from_spec(job.parallelism, world_size=world)
    mesh = dims.build_mesh("cpu")
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=torch.device("cpu"))
    optimizer = build_optimizer(pm.parts[0], job.training)
    gen = torch.Generator().manual_seed(rank)

    def step() -> None:
        tokens = torch.randint(0, 2048, (4, args.seq_len + 1), generator=gen)
        pm.forward_backward(tokens[:, :-1], tokens[:, 1:])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up
        step()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        wall = time.perf_counter() - t0
    alltoall_us = sum(e.cpu_time_total for e in prof.key_averages() if e.key in ALLTOALL_OPS)
    share = torch.tensor([alltoall_us / 1e6 / wall, wall / args.steps], dtype=torch.float64)
    dist.all_reduce(share)
    if rank == 0:
        print(json.dumps({"alltoall_share": round(share[0].item() / world, 4),
                          "step_s": round(share[1].item() / world, 4), "world": world,
                          "ep": dims.ep, "model": args.model, "seq_len": args.seq_len,
                          "steps": args.steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
