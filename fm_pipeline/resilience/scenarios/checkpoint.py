"""Checkpoint corruption: a byte flipped in, a truncation of, or a deleted file of the newest
checkpoint. Discovery must reject it with the reason and fall back to the previous valid
one; the resumed run must never load it.

All three start from one base run (steps 0 -> 6, checkpoints 2, 4, 6, local tier only: with
the store tier on, the intact remote copy of step 6 would be restored instead, and 0 steps
lost) restored from a snapshot before each fault.
"""

from __future__ import annotations

from typing import Callable

from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience import injectors
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.recovery import resume
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event

BASE_JOB = "chaos-ckpt"
BASE_STEP = 6


def base_run(ws: ChaosWorkspace):
    """The job with checkpoints 2, 4 and 6 committed (trained once per workspace)."""
    snapshot = ws.home / "snapshots" / f"{BASE_JOB}-base"
    job = ws.job(BASE_JOB)
    if not snapshot.is_dir():
        ws.prepare(job)
        live = LiveSegment(SegmentLaunch(job, end_step=BASE_STEP), site=ws.site).start()
        result = live.result()
        if not result.ok:
            raise RuntimeError(f"the base run of the checkpoint faults failed: {result.reason}")
        ws.snapshot(BASE_JOB, "base")
    else:
        ws.restore_snapshot(BASE_JOB, "base")
    return job


def _corrupt_and_resume(ws: ChaosWorkspace, fault: str, damage: Callable, detects: str,
                        *, expected: str) -> FaultResult:
    job = base_run(ws)
    result = FaultResult(fault, expected=expected)
    victim = injectors.checkpoint_victim(ws.checkpoint_dir(job.name, BASE_STEP))
    result.injected = f"{damage(victim)} of step {BASE_STEP}"
    # Damage at rest has no moment a launcher sees: the next restore finds it, and that is
    # inside the time to resume.
    append_event(ws.site.runs_dir(job.name), "fault_injected", fault=fault, target=result.injected,
                 step=BASE_STEP, detect=False)
    found, skipped = ws.newest_valid(job)
    resumed = resume(ws, job, end_step=job.training.steps)
    log = resumed.result.output_log and open(resumed.result.output_log, errors="replace").read()
    rejected = [line for line in skipped if f"step-{BASE_STEP:08d}" in line]
    restored = resumed.restored_step
    reason = rejected[0].split(": ", 1)[1] if rejected else "not rejected"
    result.outcome = (f"discovery skipped step {BASE_STEP} ({reason}); resumed from step "
                      f"{restored}, {resumed.result.outcome.value}")
    result.record_figures(ws.site.runs_dir(job.name))
    result.check(f"discovery rejects step {BASE_STEP}, naming {victim.name} and the "
                 f"{detects}", bool(rejected) and victim.name in rejected[0])
    said = [line for line in (log or "").splitlines() if f"step-{BASE_STEP:08d}" in line and
            any(w in line for w in ("skipping checkpoint", "cannot restore", "skipped checkp"))]
    result.check(f"the trainer logs the rejection when it restores: "
                 f"{said[0].split('WARNING: ')[-1][:90] if said else 'nothing'!r}", bool(said))
    result.check(f"nothing corrupt accepted: resumed from the previous valid checkpoint (step "
                 f"{found}), never step {BASE_STEP}", restored == found == BASE_STEP - 2)
    result.check(f"the resumed segment completes at step {job.training.steps}",
                 resumed.completed and resumed.segment.get("end_step") == job.training.steps)
    return result


def flip_byte(ws: ChaosWorkspace) -> FaultResult:
    return _corrupt_and_resume(
        ws, "ckpt-flip-byte", injectors.flip_byte, "checksum mismatch",
        expected="the file's size is unchanged; its checksum no longer matches the manifest: "
                 "skipped, previous checkpoint restored")


def truncate(ws: ChaosWorkspace) -> FaultResult:
    return _corrupt_and_resume(
        ws, "ckpt-truncate", injectors.truncate, "size mismatch",
        expected="size differs from the manifest: skipped, previous checkpoint restored")


def delete(ws: ChaosWorkspace) -> FaultResult:
    return _corrupt_and_resume(
        ws, "ckpt-delete", injectors.delete, "missing file",
        expected="a file the manifest lists is missing: skipped, previous checkpoint restored")
