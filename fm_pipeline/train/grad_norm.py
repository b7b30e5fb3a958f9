"""Global gradient norm over every parameter of every rank, and clipping by it.

Precision: fp32 `vector_norm` on CPU accumulates naively (1% error at 1e8 elements) and
float64 costs ~10x. So each gradient is cut into 64k-element chunks whose fp32 norms are
exact to ~1e-7, and their squares are summed in float64.

Distribution: gradients may be DTensors (FSDP x TP x HSDP) or plain tensors, and pipeline
stages hold disjoint parameters. Each rank sums the squares of its local shards; that sum is
all-reduced over exactly the mesh dimensions the gradient is sharded on (not the ones it is
replicated on), then over the pipeline stages.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

CHUNK = 1 << 16


def _sum_of_squares(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    chunks = [c for t in tensors for c in t.detach().reshape(-1).split(CHUNK) if c.numel()]
    if not chunks:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack(torch._foreach_norm(chunks)).double().pow(2).sum()


def _reduce_dims(grad: DTensor) -> tuple:
    """The mesh (by identity) and the dimensions whose ranks hold different parts."""
    dims = tuple(i for i, p in enumerate(grad.placements) if not isinstance(p, Replicate))
    return (id(grad.device_mesh), dims)


@torch.no_grad()
def global_grad_norm(params: list[nn.Parameter], *, pp_group=None) -> torch.Tensor:
    """The L2 norm of all gradients of the model (all ranks agree), a float64 scalar."""
    device = next((p.device for p in params), torch.device("cpu"))
    plain: list[torch.Tensor] = []
    sharded: dict[tuple, list[DTensor]] = defaultdict(list)
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):  # not expected after backward
                g = g.redistribute(placements=[Replicate() if pl.is_partial() else pl
                                               for pl in g.placements])
            sharded[_reduce_dims(g)].append(g)
        else:
            plain.append(g)
    total = _sum_of_squares(plain, device)
    for (_, dims), grads in sharded.items():
        part = _sum_of_squares([g.to_local() for g in grads], device)
        mesh = grads[0].device_mesh
        for dim in dims:
            dist.all_reduce(part, group=mesh.get_group(dim))
        total += part
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


@torch.no_grad()
def clip_grads_(params: list[nn.Parameter], *, max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale gradients so that their global norm is at most `max_norm` (one batched call per
    device mesh: DTensor ops cannot mix meshes, and expert parallelism adds one)."""
    by_mesh: dict = defaultdict(list)
    for p in params:
        by_mesh[getattr(p, "device_mesh", None)].append(p)
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total_norm.float(), foreach=True)
