"""Activation checkpointing per transformer block (composable API: parameter names unchanged,
so checkpoints load with or without it).

- full: keep only each block's input, recompute the block in backward.
- selective: recompute the cheap element-wise ops but keep matmul and attention outputs
  (op-level selective checkpointing), trading some memory for ~no extra FLOPs.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.distributed._composable import checkpoint
from torch.utils import checkpoint as torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from fm_pipeline.model import Transformer

_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


# torch 2.13 runs FSDP2/DTensor hooks under record_function, whose profiler ops fire a
# different number of times during recomputation and desync SAC's replay (pytorch SAC
# "encountered during backward but not found in storage"); SAC must not account for them.
torch_checkpoint.SAC_IGNORED_OPS |= {
    getattr(packet, overload)
    for name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit")
    if hasattr(torch.ops.profiler, name)
    for packet in [getattr(torch.ops.profiler, name)]
    for overload in packet.overloads()
}


def _save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpoint(model: Transformer, mode: str) -> None:
    if mode == "none":
        return
    if mode not in ("full", "selective"):
        raise ValueError(f"activation_checkpoint must be none, selective or full, got {mode!r}")
    for block in model.layers.values():
        if mode == "full":
            checkpoint(block)
        else:
            checkpoint(block, context_fn=partial(create_selective_checkpoint_contexts,
                                                 _save_matmuls))
