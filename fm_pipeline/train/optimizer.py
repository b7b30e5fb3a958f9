"""AdamW per model part and the learning-rate schedule: linear warmup, then cosine to min_lr.

One optimizer per model part (pipeline virtual stages each have their own), stepped
together; the checkpoint stores them flattened by parameter name, so any split reloads.
Weight decay applies to matrices (linear and embedding weights), not to norm gains; a group
per device mesh too (foreach and fused kernels run on one mesh's tensors at a time).
The implementation follows the device: fused (one kernel for all parameters) on CUDA,
foreach (batched tensor ops) elsewhere. Both keep the same state (`step`, `exp_avg`,
`exp_avg_sq` per parameter), so checkpoints move between them (OptimizerState keeps the
running optimizer's choice when it loads one written by the other).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fm_pipeline.config import TrainingSpec


def lr_factor(step_index: int, training: TrainingSpec) -> float:
    """Multiplier of `training.lr` for the optimizer step with 0-based index `step_index`."""
    warmup, total = training.warmup_steps, training.steps
    if step_index < warmup:
        return (step_index + 1) / warmup
    floor = training.min_lr / training.lr
    progress = min(1.0, (step_index - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def adamw_implementation(device: torch.device) -> dict[str, bool]:
    """AdamW's keyword for `device`: fused on CUDA, foreach elsewhere."""
    return {"fused": True} if device.type == "cuda" else {"foreach": True}


def mesh_key(p: torch.Tensor):
    """Which device mesh a (DTensor) parameter lives on (meshes compare by their ranks and
    names); batched tensor ops cannot mix them (expert-parallel experts live on another mesh
    than the rest)."""
    return getattr(p, "device_mesh", None)


def build_optimizer(part: nn.Module, training: TrainingSpec) -> torch.optim.AdamW:
    by_key: dict[tuple, list[nn.Parameter]] = {}
    for p in part.parameters():
        by_key.setdefault((p.ndim < 2, mesh_key(p)), []).append(p)
    groups = [{"params": params, "weight_decay": 0.0 if no_decay else training.weight_decay}
              for (no_decay, _), params in by_key.items()]
    device = next(part.parameters()).device  # a sharded (DTensor) parameter's local device
    return torch.optim.AdamW(groups, lr=training.lr, betas=(training.beta1, training.beta2),
                             eps=1e-8, **adamw_implementation(device))


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, training: TrainingSpec
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_factor(i, training))
