"""After a fault: what the orchestrator decides, the resumed segment, and what it cost.

    attempt = attempt_of(result, failed_at_step=5)
    decision = decide(attempt, earlier=[])             # the orchestrator's own policy
    resumed = resume(ws, job, end_step=8, fault_time=t)
    resumed.restored_step, resumed.first_step_at, resumed.result.outcome

The decision is fm_pipeline.orchestration.retry.decide_after_failure (the function the
Dagster failure sensor calls), with the backoff set to zero: chaos runs measure the
mechanics (detection, restart, restore); production adds backoff_base_s x 2^(n-1) before
a retry. Where that module is not installed, a failure is resumed by re-running the segment
(the trainer restores the newest valid checkpoint either way) and the decision says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fm_pipeline.launch.outcome import SegmentResult
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.workspace import ChaosWorkspace


@dataclass(frozen=True)
class Decision:
    resume: bool
    reason: str
    source: str  # "orchestration policy" | "re-run (no orchestration policy installed)"


def attempt_of(result: SegmentResult, *, failed_at_step: int | None, start_step: int | None,
               ended_at: float | None = None, run_id: str | None = None):
    from fm_pipeline.orchestration.retry import SegmentAttempt

    return SegmentAttempt(run_id=run_id or f"{result.job}-{result.segment_dir}",
                          outcome=result.outcome.value, ended_at=ended_at or time.time(),
                          reason=result.reason, exit_code=result.exit_code,
                          failed_at_step=failed_at_step, start_step=start_step,
                          end_step=result.end_step, wall_s=result.duration_s)


def decide(result: SegmentResult, *, failed_at_step: int | None, start_step: int | None,
           earlier: list[Any] = ()) -> tuple[Decision, Any]:
    """(the decision, the attempt record to pass as `earlier` next time)."""
    try:
        from fm_pipeline.orchestration.retry import RetryPolicy, decide_after_failure
    except ImportError:
        return Decision(True, "resume from the newest valid checkpoint",
                        "re-run (no orchestration policy installed)"), None
    attempt = attempt_of(result, failed_at_step=failed_at_step, start_step=start_step,
                         run_id=f"chaos-{len(earlier)}")
    d = decide_after_failure(attempt, earlier=list(earlier),
                             policy=RetryPolicy(backoff_base_s=0.0, backoff_max_s=0.0))
    return Decision(d.resume, d.reason, "orchestration policy"), attempt


@dataclass
class Resumed:
    result: SegmentResult
    segment: dict  # the resumed launch's segments.jsonl record
    restored_step: int | None
    first_step_at: float | None  # unix time rank 0 logged the launch's first step
    started_at: float

    @property
    def completed(self) -> bool:
        return self.result.ok and self.segment.get("exit_reason") == "completed"


def restored_step(segment: dict) -> int | None:
    source = segment.get("restored_from")
    if not source:
        return None
    return int(str(source).rstrip("/").rsplit("step-", 1)[1])


def resume(ws: ChaosWorkspace, job, *, end_step: int, env: dict[str, str] | None = None,
           overrides: tuple[str, ...] = (), timeout_s: float = 600) -> Resumed:
    """Launch the segment again (the trainer restores the newest valid checkpoint)."""
    live = LiveSegment(SegmentLaunch(job, end_step=end_step, overrides=overrides), site=ws.site, env=env,
                       timeout_s=timeout_s).start()
    try:
        result = live.result(timeout_s=timeout_s + 60)
    finally:
        live.cleanup()
    records = ws.segments(job.name, since=live.started_at)
    segment = records[-1] if records else {}
    steps = live.steps()
    return Resumed(result=result, segment=segment, restored_step=restored_step(segment),
                   first_step_at=steps[0]["time"] if steps else None,
                   started_at=live.started_at)


def last_step(live: LiveSegment) -> int | None:
    steps = live.steps()
    return max(r["step"] for r in steps) if steps else None
