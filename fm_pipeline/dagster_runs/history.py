"""A training job's segment attempts, read back from the Dagster instance (runs, their tags
and step failure events): what the failure and progress sensors, the demo summary and the
job-level goodput reason about. Nothing here decides; fm_pipeline.orchestration does.
"""

from __future__ import annotations

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterRunStatus, RunsFilter
from fm_pipeline.dagster_runs.names import (
    PARTITION_TAG,
    SEGMENT_JOB,
    TAG_END,
    TAG_FAILED_AT,
    TAG_OUTCOME,
    TAG_START,
)

from fm_pipeline.orchestration import SegmentAttempt

CHECKPOINT = AssetKey("checkpoint")  # the checkpoint asset (assets/training/checkpoints.py)
_FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def segment_run_records(instance, job_name: str, *, limit: int = 100) -> list:
    """The job's segment runs, newest first."""
    return list(instance.get_run_records(
        filters=RunsFilter(job_name=SEGMENT_JOB, tags={PARTITION_TAG: job_name}),
        limit=limit))


def step_failure(instance, run_id: str) -> tuple[dict, str]:
    """(metadata values, description) of the run's first step failure: the launcher's
    outcome, exit code and reason when the segment itself failed."""
    for record in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        data = record.dagster_event.step_failure_data
        user = data.user_failure_data
        if user is not None:
            metadata = {k: getattr(v, "value", v) for k, v in (user.metadata or {}).items()}
            return metadata, user.description or ""
        return {}, f"{record.step_key}: {_root_cause(data.error)}"
    return {}, "the run failed before any step ran"


def _root_cause(error) -> str:
    """The innermost error of a step failure, in one line (Dagster wraps the op's exception
    in DagsterExecutionStepExecutionError: its own message names the op, not the cause)."""
    if error is None:
        return "step failed"
    while error.cause is not None:
        error = error.cause
    message = (error.message or "").strip()
    return message.splitlines()[0] if message else error.cls_name or "failed"


def _int(value) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def attempt_of(instance, record) -> SegmentAttempt | None:
    """The attempt a finished segment run was; None while it runs."""
    run = record.dagster_run
    if run.status not in _FINISHED:
        return None
    ended = record.end_time or record.update_timestamp.timestamp()
    tags = run.tags
    if run.status == DagsterRunStatus.SUCCESS:
        meta = segment_metadata(instance, run.run_id)
        return SegmentAttempt(
            run_id=run.run_id, outcome="succeeded", ended_at=ended, exit_code=0,
            start_step=_int(meta.get("start_step", tags.get(TAG_START))),
            end_step=_int(meta.get("end_step", tags.get(TAG_END))),
            wall_s=meta.get("wall_s"), step_time_s=meta.get("step_time_s"))
    if run.status == DagsterRunStatus.CANCELED:
        return SegmentAttempt(run_id=run.run_id, outcome="cancelled", ended_at=ended,
                              reason="cancelled", start_step=_int(tags.get(TAG_START)))
    meta, description = step_failure(instance, run.run_id)
    return SegmentAttempt(
        run_id=run.run_id, outcome=str(tags.get(TAG_OUTCOME) or meta.get("outcome", "failed")),
        ended_at=ended, reason=str(meta.get("reason") or description),
        exit_code=_int(meta.get("exit_code")),
        failed_at_step=_int(tags.get(TAG_FAILED_AT, meta.get("failed_at_step"))),
        start_step=_int(meta.get("start_step", tags.get(TAG_START))),
        end_step=_int(meta.get("end_step", tags.get(TAG_END))),
        wall_s=meta.get("duration_s"))


def segment_metadata(instance, run_id: str) -> dict:
    """The training_segment materialization metadata of a successful run ({} if none)."""
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        mat = record.dagster_event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == "training_segment":
            return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return {}


def attempts(instance, job_name: str, *, limit: int = 100) -> list[SegmentAttempt]:
    """Every finished attempt of the job, newest first."""
    found = (attempt_of(instance, r) for r in segment_run_records(instance, job_name,
                                                                   limit=limit))
    return [a for a in found if a is not None]


def recorded_checkpoints(instance, job_name: str, *, run_id: str | None = None,
                         limit: int = 1000) -> list[dict]:
    """Checkpoint materializations of a job (optionally of one run), newest first, as
    {"step", "uri", "storage_id", "run_id"}."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=CHECKPOINT, asset_partitions=[job_name]),
        limit=limit, ascending=False).records
    out = []
    for record in records:
        entry = record.event_log_entry
        if run_id is not None and entry.run_id != run_id:
            continue
        meta = record.asset_materialization.metadata
        out.append({"step": meta["step"].value, "uri": str(meta["uri"].value),
                    "storage_id": record.storage_id, "run_id": entry.run_id})
    return out
