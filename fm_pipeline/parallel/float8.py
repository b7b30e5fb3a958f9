"""FP8 linear layers (torchao's Float8Linear), applied to a model part before any other
parallelism, as torchtitan's float8 converter does:

    apply_float8(part, recipe="tensorwise", fsdp=True)

Every nn.Linear inside the transformer blocks whose widths torch._scaled_mm accepts
(multiples of 16) computes its forward and both backward GEMMs in FP8 (E4M3 forward, E5M2
gradients) with dynamic scales: one per tensor ("tensorwise") or per row ("rowwise"). The
output layer stays bf16 (torchtitan skips it too); so do norms, attention scores and the
loss. Parameter names and dtypes do not change, so checkpoints move freely between bf16
and FP8 runs. Under FSDP2 the tensorwise recipe all-gathers weights already cast to FP8
(half the bytes). On a CPU, torch._scaled_mm runs the same FP8 arithmetic without FP8 units.

torchao is optional: `pip install 'fm-pipeline[fp8]'`.
"""

from __future__ import annotations

import dataclasses
import logging

from torch import nn

FP8_ALIGNMENT = 16  # torch._scaled_mm: both GEMM dimensions multiples of 16


def _torchao_float8():
    # torchao's CUDA extensions fail to load on CPU-only torch (its float8 training does
    # not use them) and it registers an enum torch now handles itself: import-time warnings
    # that would only alarm.
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.ERROR)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise RuntimeError(
            "parallelism.mixed_precision fp8-* needs torchao (torchao.float8): "
            "pip install 'fm-pipeline[fp8]'") from e
    finally:
        for log, level in zip(quiet, levels, strict=True):
            log.setLevel(level)
    return Float8LinearConfig, convert_to_float8_training


def fp8_eligible(module: nn.Module, fqn: str) -> bool:
    """A block's linear layer with FP8-compatible widths (never the output layer)."""
    return (isinstance(module, nn.Linear) and fqn.startswith("layers.")
            and module.in_features % FP8_ALIGNMENT == 0
            and module.out_features % FP8_ALIGNMENT == 0)


def apply_float8(part: nn.Module, *, recipe: str, fsdp: bool) -> int:
    """Swap the eligible linear layers of `part` for Float8Linear in place (meta device is
    fine); return how many were converted."""
    config_cls, convert = _torchao_float8()
    config = config_cls.from_recipe_name(recipe)
    if recipe == "tensorwise":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=fsdp)
    eligible = [fqn for fqn, m in part.named_modules() if fp8_eligible(m, fqn)]
    convert(part, config=config, module_filter_fn=fp8_eligible)
    return len(eligible)
