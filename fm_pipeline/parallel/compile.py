"""torch.compile per transformer block (`training.compile`), torchtitan's approach: the blocks
are identical, so one compiled graph serves them all and start-up stays short; embedding,
final norm and loss stay eager.

Only each block's `forward` is compiled. The hooks that parallelism registers around it
(FSDP2's all-gathers and reduce-scatters, activation checkpointing) keep running eagerly,
as they do under torchtitan's `fully_shard` of compiled blocks, and parameter names do not
change (no `_orig_mod.` prefix), so checkpoints load with compile on or off.

Inductor generates C++ on CPU and Triton on CUDA: a CPU run needs a C++ compiler, checked
before anything is compiled so that its absence is a clear error, not a trace from the
first step.
"""

from __future__ import annotations

import torch

from fm_pipeline.model import Transformer


class CompilerMissingError(ValueError):
    """training.compile on a machine that cannot compile (exit 2: retrying will not help)."""


def check_compile_toolchain(device: torch.device) -> None:
    """Raise CompilerMissingError if inductor cannot build kernels for `device`."""
    if device.type != "cpu":
        return  # CUDA kernels come from Triton, which ships with torch's CUDA wheels
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()  # inductor's own search: $CXX, else g++
    except Exception as e:
        tried = [c for c in config.cpp.cxx if c] if isinstance(config.cpp.cxx, (list, tuple)) \
            else [config.cpp.cxx]
        raise CompilerMissingError(
            f"training.compile: true needs a C++ compiler on CPU (torch inductor); none of "
            f"{', '.join(map(str, tried))} runs here ({type(e).__name__}). Install one "
            "(e.g. apt-get install g++), point $CXX at one, or set training.compile: false"
        ) from e


def apply_compile(model: Transformer) -> None:
    """Compile the forward of every transformer block of `model` (a whole model or a part)."""
    for block in model.layers.values():
        # fullgraph: a graph break would silently leave part of the block eager.
        block.forward = torch.compile(block.forward, fullgraph=True)
