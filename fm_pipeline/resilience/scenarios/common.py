"""Inject a fault into a live segment, let the orchestration policy decide, resume, and
record what it cost: the steps of every process-level scenario.

    run = fault_and_resume(ws, result, job, at_step=3, inject=lambda live: ...)
    run.failed.outcome, run.resumed.restored_step, run.expected_step
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from fm_pipeline.launch.outcome import SegmentResult
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.recovery import Decision, Resumed, decide, last_step, resume
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event, read_events


@dataclass
class FaultRun:
    failed: SegmentResult
    fault_time: float
    last_step: int | None  # last step rank 0 logged before the segment ended
    expected_step: int | None  # newest valid checkpoint after the fault
    skipped: list[str]  # newer checkpoints discovery rejected, with the reason
    decision: Decision
    resumed: Resumed | None


def fault_and_resume(ws: ChaosWorkspace, result: FaultResult, job, *, at_step: int,
                     inject: Callable[[LiveSegment], str], env: dict | None = None,
                     fault: str, after_checkpoint: int | None = 2) -> FaultRun:
    """Train `job`, call `inject(live)` once step `at_step` is logged and checkpoint
    `after_checkpoint` committed (so that there is one to resume from), wait for the end,
    ask the policy, and resume when it says so. Fills result.injected, and the figures
    from the job's records once the resume ended."""
    ws.prepare(job)
    end = job.training.steps
    live = LiveSegment(SegmentLaunch(job, end_step=end), site=ws.site, env=env).start()
    try:
        live.wait_for_step(at_step)
        if after_checkpoint is not None:
            live.wait_for_checkpoint(after_checkpoint)
        fault_time = time.time()
        result.injected = inject(live)
        append_event(ws.site.runs_dir(job.name), "fault_injected", fault=fault, target=result.injected,
                     step=last_step(live))
        failed = live.result()
    finally:
        live.cleanup()
    reached = last_step(live)
    expected, skipped = ws.newest_valid(job)
    decision, _ = decide(failed, failed_at_step=reached, start_step=0)
    resumed = None
    if decision.resume:
        resumed = resume(ws, job, end_step=end, env=env)
    result.record_figures(ws.site.runs_dir(job.name))
    return FaultRun(failed=failed, fault_time=fault_time, last_step=reached,
                    expected_step=expected, skipped=skipped, decision=decision,
                    resumed=resumed)


def recovery_checks(result: FaultResult, run: FaultRun, job, ws: ChaosWorkspace) -> None:
    """What every recoverable fault must show: resumed, from the newest valid checkpoint
    (nothing committed lost), to the end, and no straggler invented by the turbulence."""
    result.check(f"the orchestration policy resumes ({run.decision.source}: "
                 f"{run.decision.reason})", run.decision.resume)
    resumed = run.resumed
    if resumed is None:
        return
    result.check(f"resumed from the newest valid checkpoint after the fault (step "
                 f"{run.expected_step}), not an older one: nothing committed is lost",
                 run.expected_step is not None and resumed.restored_step == run.expected_step)
    result.check(f"the resumed segment completes at step {job.training.steps} "
                 f"({resumed.result.outcome.value})",
                 resumed.completed and resumed.segment.get("end_step") == job.training.steps)
    stragglers, _ = read_events(ws.site.runs_dir(job.name), kinds=("straggler",))
    result.check("no straggler event raised by these healthy ranks", not stragglers)


def describe_outcome(failed: SegmentResult, run: FaultRun | None = None) -> str:
    where = f" rank {failed.failed_rank}" if failed.failed_rank is not None else ""
    text = f"{failed.outcome.value} (exit {failed.exit_code}{where}): {first_line(failed.reason)}"
    if run is not None and run.resumed is not None:
        text += (f"; resumed from step {run.resumed.restored_step}, "
                 f"{run.resumed.result.outcome.value}")
    return text


def first_line(text: str, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
