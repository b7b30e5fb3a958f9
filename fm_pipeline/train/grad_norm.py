"""Global gradient norm over every parameter of every rank, and clipping by it.

Gradients may be DTensors on different meshes (FSDP x TP) or plain tensors, and pipeline
stages hold disjoint parameters. Norms are summed per (mesh, placements) group, where DTensor
reduces the shards correctly, then across pipeline stages. Accumulated in float64: fp32
`vector_norm` on CPU loses digits on large tensors, and the logged norm should not drift.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _group_key(grad: torch.Tensor):
    if isinstance(grad, DTensor):
        return (id(grad.device_mesh), tuple(grad.placements))
    return None


@torch.no_grad()
def global_grad_norm(params: list[nn.Parameter], *, pp_group=None) -> torch.Tensor:
    """The L2 norm of all gradients of the model (all ranks agree), a float64 scalar."""
    groups: dict = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[_group_key(p.grad)].append(p.grad)
    device = next((p.device for p in params), torch.device("cpu"))
    if isinstance(device, torch.device) and device.type == "meta":
        device = torch.device("cpu")
    total_sq = torch.zeros((), dtype=torch.float64, device=device)
    for grads in groups.values():
        norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
        sq = (norms * norms).sum()
        if isinstance(sq, DTensor):
            sq = sq.full_tensor()
        total_sq += sq.to(device)
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total_sq, group=pp_group)
    return total_sq.sqrt()


@torch.no_grad()
def clip_grads_(params: list[nn.Parameter], *, max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale gradients so that their global norm is at most `max_norm`."""
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm.float(), foreach=True)
