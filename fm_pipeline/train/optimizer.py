"""AdamW per model part and the learning-rate schedule: linear warmup, then cosine to min_lr.

One optimizer per model part (pipeline virtual stages each have their own), stepped
together; the checkpoint stores them flattened by parameter name, so any split reloads.
Weight decay applies to matrices (linear and embedding weights), not to norm gains.
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


def build_optimizer(part: nn.Module, training: TrainingSpec) -> torch.optim.AdamW:
    decay = [p for p in part.parameters() if p.ndim >= 2]
    no_decay = [p for p in part.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": training.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=training.lr, betas=(training.beta1, training.beta2),
                             eps=1e-8, foreach=True)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, training: TrainingSpec
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_factor(i, training))
