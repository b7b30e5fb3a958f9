"""A finished segment in numbers: steps, measured step time and MFU beside the plan's
prediction, and goodput; plus the job's goodput over all its attempts.

    report = segment_report(job, summary, duration_s=41.2, plan=plan)
    report["goodput"], report["step_time_error"], report["plan_verdict"]

`summary` is what rank 0 reports at the segment's end (fm_pipeline/rundir/records.py,
segments.jsonl fields: start_step, end_step, final_loss, mean_mfu, tokens_per_s, ...), as it
arrives through Dagster Pipes from a local process or a pod alike.

Goodput is the share of the wall time held that went into optimizer steps that count:
    segment   steps x steady step time / the launch's wall time (start-up, restore,
              checkpoint stalls and shutdown are the rest)
    job       steps reached x median steady step time / the wall time of every launch,
              failed ones included (their lost steps and restarts are the waste)
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fm_pipeline.planner.compare import compare_with_measured


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def segment_report(job, summary: Mapping[str, Any], *, duration_s: float,
                   plan: Mapping[str, Any] | None) -> dict[str, Any]:
    start, end = summary.get("start_step"), summary.get("end_step")
    steps = end - start if isinstance(start, int) and isinstance(end, int) else None
    tokens_per_s = _number(summary.get("tokens_per_s"))
    step_time = job.tokens_per_step / tokens_per_s if tokens_per_s else None
    report: dict[str, Any] = {"steps": steps, "step_time_s": step_time,
                              "wall_s": duration_s}
    if steps is not None and step_time is not None and duration_s > 0:
        report["productive_s"] = steps * step_time
        report["goodput"] = min(1.0, steps * step_time / duration_s)
    estimate = (plan or {}).get("estimate") or {}
    predicted_time, predicted_mfu = _number(estimate.get("step_time_s")), _number(
        estimate.get("mfu"))
    if step_time and predicted_time and predicted_mfu:
        mfu = _number(summary.get("mean_mfu"))
        cmp = compare_with_measured(predicted_step_time_s=predicted_time,
                                    predicted_mfu=predicted_mfu, measured_step_time_s=step_time,
                                    measured_mfu=mfu if mfu else None)
        report.update(predicted_step_time_s=predicted_time, predicted_mfu=predicted_mfu,
                      step_time_error=cmp.step_time_error, mfu_error=cmp.mfu_error,
                      plan_verdict=cmp.verdict)
    return report


def job_goodput(*, reached_step: int, step_times_s: Sequence[float],
                launch_wall_s: Sequence[float]) -> float | None:
    """Goodput of the whole job so far; None before any measured segment."""
    held = sum(launch_wall_s)
    if not step_times_s or held <= 0 or reached_step <= 0:
        return None
    return min(1.0, reached_step * statistics.median(step_times_s) / held)


def straggler_costs(segments: Sequence[Mapping[str, Any]],
                    ended: Sequence[Mapping[str, Any]],
                    drops: Sequence[Mapping[str, Any]] = ()) -> dict[str, float | int]:
    """What stragglers cost the job, from its records: `segments`, the job report's rows
    (oldest first: status, reason, wall_s, productive_s); `ended`, its "straggler_end"
    events. stops: launches the exclude policy stopped ("straggler:" in the stop's reason);
    restart_s: the start-up and restore of the launch after each such stop (its wall time
    not in steps that count); idle_gpu_s: the peers' time spent waiting for the slow rank
    while it lagged; `drops`, its "straggler_drop_end" events: tokens_dropped, the rows the
    drop policy did not compute (lost tokens), and drop_gpu_s, their work in GPU-seconds."""
    stops, restart_s = 0, 0.0
    for i, row in enumerate(segments):
        if "straggler:" not in str(row.get("reason") or ""):
            continue
        stops += 1
        after = next((r for r in segments[i + 1:] if r.get("status") == "SUCCESS"), None)
        wall, productive = (_number(after.get(k)) for k in ("wall_s", "productive_s")) \
            if after else (None, None)
        if wall is not None and productive is not None:
            restart_s += max(0.0, wall - productive)
    idle = sum(float(e.get("idle_gpu_hours") or 0.0) for e in ended) * 3600
    return {"stops": stops, "restart_s": round(restart_s, 3), "idle_gpu_s": round(idle, 3),
            "tokens_dropped": sum(int(d.get("tokens_dropped") or 0) for d in drops),
            "drop_gpu_s": round(sum(float(d.get("drop_cost_gpu_s") or 0.0) for d in drops), 3)}
