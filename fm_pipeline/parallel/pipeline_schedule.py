"""The pipeline schedule over a rank's stages (torch.distributed.pipelining), imported by
parallelize.py only when pp > 1: the import alone costs ~1.7 s of a worker's start."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from fm_pipeline.model import Transformer

SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe, "Interleaved1F1B": ScheduleInterleaved1F1B}


class RoutedStage(PipelineStage):
    """A stage whose MoE layers count only the step's micro-batches: torch infers the
    stages' shapes by running each stage forward and backward once on the first step (and
    again after an evaluation), on the real first micro-batch or on empty tensors, which
    the router would count as tokens routed. The counts go once that inference is done
    (the hook torch 2.13 calls then: its FSDP cleanup of the same run)."""

    def _post_metadata_inference_cleanup(self) -> None:
        super()._post_metadata_inference_cleanup()
        self.submod.take_router_stats()


def build_schedule(
    parts: list[Transformer],
    *,
    stages: list[int],
    n_stages: int,
    schedule: str,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    pp_group,
):
    """One PipelineStage per model part, driven by the named schedule."""
    pipeline_stages = [
        RoutedStage(part, stage_idx, n_stages, device, group=pp_group)
        for part, stage_idx in zip(parts, stages, strict=True)
    ]
    cls = SCHEDULES[schedule]
    if cls is ScheduleInterleaved1F1B:
        return cls(pipeline_stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    (only_stage,) = pipeline_stages
    return cls(only_stage, n_microbatches=n_microbatches, loss_fn=loss_fn)
