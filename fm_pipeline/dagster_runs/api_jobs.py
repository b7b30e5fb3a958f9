"""The REST API's runs of a training job, read back from Dagster run records.

One API run (one submission of the job by a control plane, orchestration.submissions) is
every segment run tagged with the same `fm/api_run` number: the first, which the daemon's
intake sensor starts, and each segment the sensors requested after it (they carry the tag).
Its state is the newest of those runs, read with the decisions the sensors recorded on it
and the stop a control plane recorded (fm/stop, or the stop marker in the store):

    last segment run                                    API run
    queued / starting                                   starting (first run) / running
    started                                             running
    succeeded at the target step                        succeeded
    succeeded, not at the target                        running (next segment due), or
                                                        preempted / cancelled (stopped)
    canceled (terminated), stop=preempt                 preempted (at a checkpoint: exit 75)
    canceled, stop=cancel or none                       cancelled
    failed, refused because the run was stopped         preempted / cancelled
    failed, decision "stopped"                          failed (outcome: reason; why)
    failed, decision "resumed" / "resume_pending"       running (the resume is due)

Nothing here depends on which process asked: every API process, the daemon and the
webserver read the same records.
"""

from __future__ import annotations

from dagster import DagsterRunStatus, RunsFilter
from fm_pipeline.dagster_runs.history import attempt_of
from fm_pipeline.dagster_runs.names import (
    PARTITION_TAG,
    SEGMENT_JOB,
    STOPPED,
    TAG_API_JOB,
    TAG_API_RUN,
    TAG_DECISION,
    TAG_DECISION_REASON,
    TAG_END,
    TAG_OUTCOME,
    TAG_OUTCOME_REASON,
    TAG_RESUME_FROM,
    TAG_STOP,
)

from fm_pipeline.api.orchestrator import RunInfo

_WAITING = {DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING}


def api_run_records(instance, job_name: str) -> dict[int, list]:
    """The job's segment run records per run number (fm/api_run: the control plane's
    submission), oldest first within each."""
    records = instance.get_run_records(
        filters=RunsFilter(job_name=SEGMENT_JOB, tags={PARTITION_TAG: job_name}),
        ascending=True)
    runs: dict[int, list] = {}
    for record in records:
        number = record.dagster_run.tags.get(TAG_API_RUN, "")
        if number.isdigit():
            runs.setdefault(int(number), []).append(record)
    return dict(sorted(runs.items()))


def api_job_names(instance) -> list[str]:
    """Every training job the API has launched runs for."""
    for key, values in instance.get_run_tags(tag_keys=[TAG_API_JOB]):
        if key == TAG_API_JOB:
            return sorted(values)
    return []


def run_info(instance, records: list, *, target_step: int, stop: str | None = None,
             run_id: str | None = None) -> RunInfo:
    """The API run made of `records` (oldest first); `stop`: the stop a control plane
    recorded for it (preempt | cancel); `run_id`: the id the API gave it."""
    first, last = records[0], records[-1]
    stop = last.dagster_run.tags.get(TAG_STOP) or stop
    state, reason = _state(instance, last, target_step=target_step, stop=stop,
                           first=len(records) == 1)
    ended_at = None
    if state not in ("starting", "running"):
        ended_at = last.end_time or last.update_timestamp.timestamp()
    return RunInfo(run_id=run_id or first.dagster_run.run_id, state=state,
                   started_at=_started(first), ended_at=ended_at, reason=reason,
                   resumed_from=first.dagster_run.tags.get(TAG_RESUME_FROM))


def _started(record) -> float:
    return record.start_time or record.create_timestamp.timestamp()


def _state(instance, record, *, target_step: int, stop: str | None,
           first: bool) -> tuple[str, str | None]:
    run = record.dagster_run
    if run.status in _WAITING:
        return ("starting" if first else "running"), None
    if run.status == DagsterRunStatus.CANCELED:
        return _terminated(run, stop)
    if run.status == DagsterRunStatus.SUCCESS:
        if int(run.tags.get(TAG_END, "0")) >= target_step:
            return "succeeded", f"reached the target step {target_step}"
        return _stopped_between_segments(stop)
    if run.status != DagsterRunStatus.FAILURE:  # started, canceling
        return "running", None
    failed = attempt_of(instance, record)
    why = f"{failed.outcome}: {failed.reason}"
    if failed.outcome == "stopped":  # refused at its start: the run was stopped already
        return _stopped_between_segments(stop or "cancel")
    if stop == "cancel":
        return "cancelled", f"cancelled by the control plane ({why})"
    if stop == "preempt":
        if failed.outcome == "preempted":
            return "preempted", f"preempted at a checkpoint: {failed.reason}"
        return "failed", why
    if run.tags.get(TAG_DECISION) == STOPPED:
        return "failed", f"{why} (not resumed: {run.tags.get(TAG_DECISION_REASON, '')})"
    return "running", why  # a resume is due (decided, or about to be)


def _terminated(run, stop: str | None) -> tuple[str, str]:
    """A canceled run: terminated, its segment stopped at a checkpoint (the asset tagged
    what the segment did)."""
    outcome = run.tags.get(TAG_OUTCOME)
    did = f" ({outcome}: {run.tags[TAG_OUTCOME_REASON]})" if outcome and \
        TAG_OUTCOME_REASON in run.tags else ""
    if stop == "preempt":
        return "preempted", f"preempted by the control plane{did}"
    if stop == "cancel":
        return "cancelled", f"cancelled by the control plane{did}"
    return "cancelled", f"terminated in Dagster{did}"


def _stopped_between_segments(stop: str | None) -> tuple[str, str | None]:
    if stop == "preempt":
        return "preempted", "preempted before segment start"
    if stop == "cancel":
        return "cancelled", "cancelled before segment start"
    return "running", None


def run_infos(instance, job_name: str, *, target_step: int,
              stops: dict[int, str] | None = None) -> dict[int, RunInfo]:
    """Every API run of the job that has a segment run, by number."""
    stops = stops or {}
    return {number: run_info(instance, records, target_step=target_step,
                             stop=stops.get(number))
            for number, records in api_run_records(instance, job_name).items()}
