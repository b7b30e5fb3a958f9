"""Predicted vs measured, after a training segment: pure arithmetic on numbers the caller
pulls from the trainer's per-step records (see fm_pipeline/rundir/records.py).

    measured = steady_step_time([2.9, 1.31, 1.30, 1.33], warmup=1)
    cmp = compare_with_measured(predicted_step_time_s=1.2, predicted_mfu=0.41,
                                measured_step_time_s=measured, measured_mfu=0.37)
    cmp.to_dict()  # side by side, signed errors, a one-line verdict
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from fm_pipeline.planner.errors import PlanInputError, require_positive


@dataclass(frozen=True)
class PredictedVsMeasured:
    predicted_step_time_s: float
    measured_step_time_s: float
    step_time_error: float  # measured / predicted - 1: > 0 means slower than planned
    predicted_mfu: float
    measured_mfu: float | None
    mfu_error: float | None  # measured / predicted - 1
    within_tolerance: bool
    verdict: str

    def to_dict(self) -> dict:
        return asdict(self)


def steady_step_time(step_times_s: Sequence[float], *, warmup: int = 2) -> float:
    """Median step time after the first `warmup` steps (compilation, allocator growth)."""
    times = [float(t) for t in step_times_s]
    if not times:
        raise PlanInputError("step_times_s", "no step times to summarize")
    if any(t <= 0 for t in times):
        raise PlanInputError("step_times_s", "step times must be > 0")
    steady = times[warmup:] if len(times) > warmup else times
    return statistics.median(steady)


def compare_with_measured(*, predicted_step_time_s: float, predicted_mfu: float,
                          measured_step_time_s: float, measured_mfu: float | None = None,
                          tolerance: float = 0.25) -> PredictedVsMeasured:
    require_positive("predicted_step_time_s", predicted_step_time_s)
    require_positive("predicted_mfu", predicted_mfu)
    require_positive("measured_step_time_s", measured_step_time_s)
    if measured_mfu is not None:
        require_positive("measured_mfu", measured_mfu)
    step_error = measured_step_time_s / predicted_step_time_s - 1
    mfu_error = None if measured_mfu is None else measured_mfu / predicted_mfu - 1
    within = abs(step_error) <= tolerance
    if within:
        verdict = f"step time within {tolerance:.0%} of the plan ({step_error:+.0%})"
    elif step_error > 0:
        verdict = (f"{step_error:.0%} slower than planned: check exposed communication, stragglers "
                   "and input pipeline stalls in the per-rank timings")
    else:
        verdict = (f"{-step_error:.0%} faster than planned: the plan is pessimistic for this "
                   "hardware (recalibrate matmul efficiency or link bandwidth)")
    return PredictedVsMeasured(
        predicted_step_time_s=predicted_step_time_s, measured_step_time_s=measured_step_time_s,
        step_time_error=step_error, predicted_mfu=predicted_mfu, measured_mfu=measured_mfu,
        mfu_error=mfu_error, within_tolerance=within, verdict=verdict,
    )
