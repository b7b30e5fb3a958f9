"""Time-to-train and money: the token budget over throughput and goodput, GPU-hours, dollars in
total and per million tokens, and what keeping checkpoints costs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.reliability import Reliability


@dataclass(frozen=True)
class Cost:
    training_tokens: float
    steps: int
    compute_days: float  # if nothing ever failed or paused
    time_to_train_days: float  # with checkpoint pauses and failures (goodput)
    gpu_hours: float
    compute_dollars: float
    checkpoint_storage_dollars: float
    dollars: float
    dollars_per_million_tokens: float

    def to_dict(self) -> dict:
        return asdict(self)


def training_cost(
    *,
    training_tokens: float,
    tokens_per_step: int,
    step_time_s: float,
    gpus: int,
    cluster: ClusterConfig,
    reliability: Reliability,
    checkpoints_kept: int = 3,
) -> Cost:
    steps = math.ceil(training_tokens / tokens_per_step)
    compute_s = steps * step_time_s
    wall_s = compute_s / max(reliability.goodput, 1e-9)
    gpu_hours = gpus * wall_s / 3600
    compute_dollars = gpu_hours * cluster.dollars_per_gpu_hour
    months = wall_s / (30 * 86400)
    storage = (
        checkpoints_kept * reliability.checkpoint_gb * cluster.storage_dollars_per_gb_month * months
    )
    total = compute_dollars + storage
    return Cost(
        training_tokens=training_tokens,
        steps=steps,
        compute_days=compute_s / 86400,
        time_to_train_days=wall_s / 86400,
        gpu_hours=gpu_hours,
        compute_dollars=compute_dollars,
        checkpoint_storage_dollars=storage,
        dollars=total,
        dollars_per_million_tokens=total / (training_tokens / 1e6),
    )
