"""torchrun worker for test_expert_parallel: one MoE layer, its experts sharded over every
rank (gloo), against the same layer held whole on each rank, on each rank's own tokens.
Writes per-rank results to $OUT/rank<r>.pt."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from fm_pipeline.model import get_model_config
from fm_pipeline.model.moe import MoEFeedForward
from fm_pipeline.parallel.expert_parallel import apply_expert_parallel


class One(torch.nn.Module):  # apply_expert_parallel walks a model's MoE layers
    def __init__(self, ffn):
        super().__init__()
        self.ffn = ffn

    def moe_layers(self):
        return [self.ffn]


def main(out_dir: str, skewed: bool) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = get_model_config("moe-debug", moe_shared_experts=1, moe_capacity_factor=1.5)
    torch.manual_seed(0)
    whole = MoEFeedForward(cfg)
    for p in whole.parameters():
        torch.nn.init.normal_(p, std=0.1)
    if skewed:  # every token prefers the first ranks' experts: the last rank gets no rows
        with torch.no_grad():
            whole.router.weight[: cfg.n_experts // world] += 3.0
    sharded = MoEFeedForward(cfg)
    sharded.load_state_dict(whole.state_dict())
    apply_expert_parallel(One(sharded), init_device_mesh("cpu", (world,), mesh_dim_names=("ep",)))
    torch.manual_seed(100 + rank)  # each rank its own tokens
    x = torch.ones(2, 9, cfg.dim) if skewed else torch.randn(2, 9, cfg.dim)
    x_whole, x_sharded = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_whole, y_sharded = whole(x_whole), sharded(x_sharded)
    (y_whole.square().sum()).backward()
    (y_sharded.square().sum()).backward()
    # The whole layer's expert gradient from this rank's tokens only: summed over ranks it
    # is what the sharded experts accumulated from everyone's.
    grad_whole = whole.experts.w1.grad.clone()
    dist.all_reduce(grad_whole)
    lo = rank * cfg.n_experts // world
    torch.save({
        "y_whole": y_whole.detach(), "y_sharded": y_sharded.detach(),
        "dx_whole": x_whole.grad, "dx_sharded": x_sharded.grad,
        "dw1_whole": grad_whole[lo: lo + cfg.n_experts // world],
        "dw1_sharded": sharded.experts.w1.grad.to_local(),
        "router_whole": whole.router.weight.grad, "router_sharded": sharded.router.weight.grad,
        "stats": (whole.stats, sharded.stats),
    }, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "skewed")
