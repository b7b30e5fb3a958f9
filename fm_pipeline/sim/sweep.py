"""Sweeps over one knob, averaged over seeds, and the analytic checkpoint interval.

    from fm_pipeline.sim.sweep import sweep_checkpoint_interval, young_daly_interval_s
    points = sweep_checkpoint_interval(cfg, [300, 600, 1200, 2400], seeds=range(4))
    best = max(points, key=lambda p: p.ettr)
    young_daly_interval_s(save_cost_s=10, mtbf_s=cfg.mtbf_s())

Seeds are shared across the values of a sweep (common random numbers: the same failure
arrivals for every interval), so differences between points are the knob's, not noise's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, pstdev
from typing import Callable, Iterable, Sequence

from fm_pipeline.sim.config import SimConfig
from fm_pipeline.sim.results import SimResult
from fm_pipeline.sim.single_job import simulate_job


@dataclass(frozen=True)
class SweepPoint:
    value: float
    ettr: float
    ettr_std: float
    goodput: float
    interruptions: float
    lost_gpu_hours: dict[str, float]
    results: tuple[SimResult, ...]


def sweep(
    cfg: SimConfig,
    values: Sequence[float],
    apply: Callable[[SimConfig, float], SimConfig],
    *,
    seeds: Iterable[int] = range(4),
    progress: Callable[[], None] | None = None,
) -> list[SweepPoint]:
    """Simulate `apply(cfg, v)` for each value and seed; mean and spread of the outputs."""
    seeds = list(seeds)
    if not seeds or not values:
        raise ValueError("a sweep needs at least one value and one seed")
    points = []
    for value in values:
        runs = []
        for seed in seeds:
            runs.append(simulate_job(apply(cfg, value).with_(seed=seed)))
            if progress is not None:
                progress()
        buckets = runs[0].lost_gpu_hours.keys()
        points.append(
            SweepPoint(
                value=value,
                ettr=fmean(r.ettr for r in runs),
                ettr_std=pstdev([r.ettr for r in runs]),
                goodput=fmean(r.goodput for r in runs),
                interruptions=fmean(r.interruptions for r in runs),
                lost_gpu_hours={b: fmean(r.lost_gpu_hours[b] for r in runs) for b in buckets},
                results=tuple(runs),
            )
        )
    return points


def sweep_checkpoint_interval(cfg: SimConfig, intervals_s: Sequence[float], **kw) -> list[SweepPoint]:
    return sweep(cfg, intervals_s, lambda c, v: c.with_(checkpoint=c.checkpoint.with_(interval_s=v)), **kw)


def sweep_failure_rate(cfg: SimConfig, factors: Sequence[float], **kw) -> list[SweepPoint]:
    """Every failure mode's rate multiplied by each factor."""
    return sweep(
        cfg, factors,
        lambda c, f: c.with_(failure_modes=tuple(m.scaled(f) for m in c.failure_modes)), **kw,
    )


def young_daly_interval_s(*, save_cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Checkpoint interval (compute time between saves) that minimises expected waste.

    Young (1974): sqrt(2 C M). Daly (2006) first order, with the restart time R:
    sqrt(2 C (M + R)) - C, valid while C < 2M. C: time the job stalls per save.
    """
    if save_cost_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"save_cost_s and mtbf_s must be > 0, got {save_cost_s}, {mtbf_s}")
    if math.isinf(mtbf_s):
        return math.inf
    if save_cost_s >= 2 * mtbf_s:
        return mtbf_s  # Daly: beyond this the expansion does not hold; save once per MTBF
    return math.sqrt(2 * save_cost_s * (mtbf_s + restart_s)) - save_cost_s


def geometric_grid(center: float, *, factor: float = 8.0, points: int = 9) -> list[float]:
    """`points` values from center/factor to center*factor, evenly spaced in log."""
    if center <= 0 or factor <= 1 or points < 2:
        raise ValueError("geometric_grid needs center > 0, factor > 1, points >= 2")
    lo, hi = math.log(center / factor), math.log(center * factor)
    return [math.exp(lo + (hi - lo) * i / (points - 1)) for i in range(points)]
