"""2 ranks (torchrun, gloo): one optimizer step's gradient under FSDP2 with a straggler row
plan equals a plain model's gradient over exactly the rows the ranks computed.

    torchrun --standalone --nproc-per-node 2 tests/train/_drop_worker.py JOB.yaml 2,1

Prints "DROP-GRADIENTS-MATCH" on rank 0 when every parameter's gradient agrees.
"""

import sys

import torch
import torch.distributed as dist

from fm_pipeline.config import load_job
from fm_pipeline.model import Transformer
from fm_pipeline.parallel import ParallelDims, build_parallel_model, init_distributed
from fm_pipeline.parallel.parallel_model import cross_entropy_loss

if __name__ == "__main__":
    job = load_job(sys.argv[1])
    plan = [int(x) for x in sys.argv[2].split(",")]
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = ParallelDims.from_spec(job.parallelism, world_size=world)
    mesh = dims.build_mesh(device.type)
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=device)
    t = job.training
    full, per_rank = t.micro_batch_size, t.global_batch_size // world
    window = t.seq_len + 1
    data = torch.randint(0, job.model_cfg.vocab_size, (world, per_rank, window),
                         generator=torch.Generator().manual_seed(1))

    def kept(r: int) -> torch.Tensor:  # what the trainer does with its batch under the plan
        return data[r].view(-1, full, window)[:, :plan[r]].reshape(-1, window)

    mine = kept(rank)
    # The trainer's scale: dp * rows / sum(rows).
    pm.forward_backward(mine[:, :-1], mine[:, 1:], micro_batch_size=plan[rank],
                        grad_scale=world * plan[rank] / sum(plan))
    grads = {n: p.grad.full_tensor() for n, p in pm.parts[0].named_parameters()}
    if rank == 0:
        ref = Transformer(job.model_cfg)
        ref.init_weights(seed=t.seed)
        rows = torch.cat([kept(r) for r in range(world)])
        cross_entropy_loss(ref(rows[:, :-1]), rows[:, 1:]).backward()
        for name, p in ref.named_parameters():
            assert torch.allclose(grads[name], p.grad, rtol=1e-4, atol=1e-6), (
                name, (grads[name] - p.grad).abs().max().item())
        print("DROP-GRADIENTS-MATCH", flush=True)
    dist.destroy_process_group()
