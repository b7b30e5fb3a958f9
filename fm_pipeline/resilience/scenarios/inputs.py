"""Bad input: an invalid job spec, and a corrupted data shard, each launched against a job
with committed checkpoints (the checkpoint scenarios' base run): the error names the
problem, nothing committed is touched, and retrying is refused where it cannot help.
"""

from __future__ import annotations

from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience import injectors
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.recovery import decide
from fm_pipeline.resilience.scenarios.checkpoint import BASE_STEP, base_run
from fm_pipeline.resilience.scenarios.common import first_line
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event

# (override, the field the error must name)
BAD_OVERRIDES = (("training.lr=-1", "training.lr"),
                 ("parallelism.tp=3", "tp 3"))


def _checkpoint_state(ws: ChaosWorkspace, job) -> dict[int, bytes]:
    """step -> manifest bytes of every committed checkpoint (what must not change)."""
    root = ws.checkpoint_dir(job.name, 0).parent
    return {int(p.parent.name.split("-")[1]): p.read_bytes()
            for p in sorted(root.glob("step-*/manifest.json"))}


def _launch(ws, job, **kwargs):
    live = LiveSegment(SegmentLaunch(job, end_step=job.training.steps, **kwargs),
                       site=ws.site).start()
    try:
        return live, live.result()
    finally:
        live.cleanup()


def bad_config(ws: ChaosWorkspace) -> FaultResult:
    job = base_run(ws)
    result = FaultResult("bad-config", expected=(
        "exit 2 (bad config) before any work, naming the field; checkpoints untouched; "
        "the orchestration policy stops instead of retrying"))
    before = _checkpoint_state(ws, job)
    outcomes = []
    result.injected = "trainer launched with " + ", ".join(f"--set {o}" for o, _ in BAD_OVERRIDES)
    for override, field in BAD_OVERRIDES:
        live, failed = _launch(ws, job, overrides=(override,))
        decision, _ = decide(failed, failed_at_step=None, start_step=BASE_STEP)
        outcomes.append(f"`{override}`: {failed.outcome.value} in {failed.duration_s:.1f} s")
        result.check(f"--set {override}: exit 2 (bad_config), got {failed.outcome.value} exit "
                     f"{failed.exit_code}",
                     failed.outcome is Outcome.BAD_CONFIG and failed.exit_code == 2)
        result.check(f"--set {override}: the reason names {field}: "
                     f"{first_line(failed.reason, 110)!r}", field in failed.reason)
        result.check(f"--set {override}: no step was trained", not live.steps())
        result.check(f"--set {override}: the policy stops ({decision.reason[:60]}...)",
                     not decision.resume)
    result.check("every committed checkpoint is byte-for-byte untouched",
                 _checkpoint_state(ws, job) == before and len(before) == 3)
    result.outcome = "; ".join(outcomes)
    result.record_figures(ws.site.runs_dir(job.name))
    return result


def bad_data(ws: ChaosWorkspace) -> FaultResult:
    job = base_run(ws)
    mix = ws.prepare(job)
    sample = BASE_STEP * job.training.global_batch_size  # the first sample after the restore
    result = FaultResult("bad-data", expected=(
        "the segment fails with the permanent exit code (2) and one line naming the corrupted "
        "shard; checkpoints untouched; the orchestration policy stops at once (retrying "
        "cannot fix data that does not match its manifest)"))
    before = _checkpoint_state(ws, job)
    path, what = injectors.corrupt_shard(ws.store_dir, mix, sample=sample)
    try:
        result.injected = what
        append_event(ws.site.runs_dir(job.name), "fault_injected", fault="bad-data", target=what, step=BASE_STEP)
        live, failed = _launch(ws, job)
        decision, _ = decide(failed, failed_at_step=BASE_STEP, start_step=BASE_STEP)
    finally:
        injectors.flip_byte(path)  # the same byte again: the shard is whole for later faults
    key = path.relative_to(ws.store_dir).as_posix()
    result.record_figures(ws.site.runs_dir(job.name))
    result.outcome = (f"{failed.outcome.value} (exit {failed.exit_code}): "
                      f"{first_line(failed.reason, 120)}; decision: "
                      f"{'resume' if decision.resume else 'stop'}")
    result.check(f"exit 2, the permanent code ({failed.outcome.value}, exit "
                 f"{failed.exit_code})",
                 failed.outcome is Outcome.BAD_CONFIG and failed.exit_code == 2)
    result.check(f"the reason is one line naming the corrupted shard {key}",
                 key in failed.reason and "\n" not in failed.reason.strip())
    result.check("every committed checkpoint is byte-for-byte untouched",
                 _checkpoint_state(ws, job) == before)
    result.check(f"the policy stops at once ({decision.reason[:70]}...)", not decision.resume)
    return result
