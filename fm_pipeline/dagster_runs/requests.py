"""Run requests for the training jobs: one per segment, evaluation or drill, with the tags
that say why it runs (names.py). Sensors, the schedule, the submit helpers and the demo
build every request here, so a run looks the same whoever asked for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import RunRequest
from fm_pipeline.dagster_runs.names import (
    TAG_CHECKPOINT_STEP,
    TAG_CHECKPOINT_STEPS,
    TAG_END,
    TAG_JOB,
    TAG_PRIORITY,
    TAG_SEGMENT_OF,
    TAG_START,
    TAG_TENANT,
    TAG_TRIGGER,
)

from fm_pipeline.orchestration.segments import SCRATCH

SUBMIT, NEXT_SEGMENT = "submit", "next_segment"
API_RESUME = "api_resume"  # the control plane started the job again (after a stop or failure)
RESUME_AFTER_FAILURE, RESUME_AFTER_PREEMPTION = "resume_after_failure", "resume_after_preemption"


def segment_request(job, plan, *, trigger: str, run_key: str | None = None,
                    tags: Mapping[str, str] | None = None, fail_at: str = "") -> RunRequest:
    """Train `job` by `plan` (orchestration.segments.plan_segment's SegmentPlan), carried in
    the run config: the segment asset launches it after checking it still holds."""
    if not 0 <= plan.start < plan.end <= job.training.steps:
        raise ValueError(f"segment {plan.start} -> {plan.end} is outside job {job.name}'s "
                         f"steps 0..{job.training.steps}")
    config = {"end_step": plan.end, "planned_start": plan.checkpoint or SCRATCH}
    if fail_at:
        config["fail_at"] = fail_at
    if plan.chosen:
        config["resume_from"] = plan.checkpoint
    return RunRequest(
        run_key=run_key, partition_key=job.name,
        run_config={"ops": {"training_segment": {"config": config}}},
        tags={TAG_JOB: job.name, TAG_SEGMENT_OF: job.name, TAG_TRIGGER: trigger,
              TAG_START: str(plan.start), TAG_END: str(plan.end), TAG_TENANT: job.tenant,
              TAG_PRIORITY: job.priority, **dict(tags or {})})


def checkpoint_request(job_name: str, step: int, *, kind: str) -> RunRequest:
    """Evaluate (kind "evaluate") or drill (kind "drill") the job's checkpoint at `step`."""
    if kind not in ("evaluate", "drill"):
        raise ValueError(f"kind must be 'evaluate' or 'drill', got {kind!r}")
    if kind == "evaluate":
        return evaluation_request(job_name, [step])
    return RunRequest(run_key=f"{kind}-{job_name}-{step}", partition_key=job_name,
                      tags={TAG_JOB: job_name, TAG_CHECKPOINT_STEP: str(step),
                            TAG_TRIGGER: f"{kind}_checkpoint"})


def evaluation_request(job_name: str, steps) -> RunRequest:
    """One evaluation run for the job's checkpoints at `steps` (those one segment recorded):
    one worker restores and scores each in turn, one materialization per checkpoint."""
    steps = sorted({int(s) for s in steps})
    if not steps:
        raise ValueError("an evaluation needs at least one checkpoint step")
    return RunRequest(run_key=f"evaluate-{job_name}-{'+'.join(map(str, steps))}",
                      partition_key=job_name,
                      tags={TAG_JOB: job_name, TAG_CHECKPOINT_STEP: str(steps[-1]),
                            TAG_CHECKPOINT_STEPS: ",".join(map(str, steps)),
                            TAG_TRIGGER: "evaluate_checkpoint"})
