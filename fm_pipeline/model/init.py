"""Parameter initialisation that gives the same weights under any parallelism.

Each parameter is drawn whole, on its own device, from a generator seeded by (seed, name);
the rank then keeps only its part (`write`). The largest single parameter is the memory
high-water mark, never the whole model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from torch import nn

WriteFn = Callable[[nn.Parameter, torch.Tensor], None]


def copy_full(param: nn.Parameter, full: torch.Tensor) -> None:
    """The unsharded case: the rank holds the whole parameter."""
    param.copy_(full)


def parameter_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def full_parameter(
    shape: torch.Size, *, std: float | None, seed: int, name: str, device: torch.device
) -> torch.Tensor:
    """The whole fp32 tensor for `name`: ones when std is None, else a +-3 std truncated normal."""
    if std is None:
        return torch.ones(shape, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(parameter_seed(seed, name))
    full = torch.empty(shape, device=device)
    return nn.init.trunc_normal_(full, std=std, a=-3 * std, b=3 * std, generator=gen)


@torch.no_grad()
def init_parameters(
    module: nn.Module,
    *,
    seed: int,
    std_for: Callable[[str], float | None],
    write: WriteFn = copy_full,
) -> None:
    for name, param in module.named_parameters():
        full = full_parameter(
            param.shape, std=std_for(name), seed=seed, name=name, device=param.device
        )
        write(param, full.to(param.dtype))
