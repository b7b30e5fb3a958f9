"""Held-out loss per data domain for a parallel model, on every rank (a collective).

Each data-parallel rank takes every dp-th batch of a domain's held-out windows; tensor-
and pipeline-parallel peers of a dp rank see the same batch. All dp ranks run the same
number of forwards (FSDP gathers parameters inside each one), so a domain is evaluated on
the largest multiple of dp batches available, capped at `max_batches`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fm_pipeline.eval.result import DomainLoss


def heldout_losses(pm, mix, *, dp_rank: int, dp: int, batch_size: int,
                   max_batches: int) -> dict[str, DomainLoss]:
    """{domain: DomainLoss} over the mix's held-out windows; every rank must call it."""
    if batch_size < 1 or max_batches < 1:
        raise ValueError(f"batch_size ({batch_size}) and max_batches ({max_batches}) must be >= 1")
    results = {}
    for source in mix.source_names:
        available = min(max_batches, mix.heldout_windows(source) // batch_size)
        n_batches = available // dp * dp
        mine = [b for b in range(n_batches) if b % dp == dp_rank]
        loss_sum = torch.zeros(2, dtype=torch.float64)  # [sum of batch losses, batches scored]
        for b in mine:
            batch = torch.from_numpy(mix.heldout_samples(source, b * batch_size, batch_size))
            batch = batch.to(pm.device)
            loss = pm.loss(batch[:, :-1], batch[:, 1:])
            if loss is not None:  # None on pipeline ranks without the last stage
                loss_sum += torch.tensor([float(loss), 1.0], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(loss_sum)
        total, scored = loss_sum.tolist()
        # Tensor-parallel peers score the same batch: the mean over scores is unaffected.
        results[source] = DomainLoss(
            loss=total / scored if scored else None,
            tokens=n_batches * batch_size * mix.seq_len,
            batches=n_batches)
    return results
