"""The sensors that drive a training job from segment to segment, and evaluate checkpoints.

    segment_failure_sensor        a segment run failed: record the failure and the decision
                                  on the run (tags) and on the job's partition (an
                                  observation), then resume now, later (backoff) or never
    segment_progress_sensor       a segment succeeded: request the next one until the job's
                                  target step; a resume whose backoff has passed: request it
    checkpoint_evaluation_sensor  a checkpoint was recorded: request its evaluation

Decisions are fm_pipeline.orchestration.retry's (retry budget, exponential backoff, crash
loops, preemptions); these functions only read the instance and act. Every request has a
run key, so a tick evaluated twice never starts a segment twice.
"""

import time

from dagster import (
    AssetObservation,
    AssetRecordsFilter,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    sensor,
)
from fm_pipeline.dagster_runs.history import CHECKPOINT
from fm_pipeline.dagster_runs.history import attempt_of, attempts, segment_run_records
from fm_pipeline.assets.training.intake import run_intake_sensor
from fm_pipeline.assets.training.jobs import checkpoint_evaluation_job, training_segment_job
from fm_pipeline.dagster_runs.names import (
    CARRIED_TAGS,
    JOBS_PARTITION,
    PARTITION_TAG,
    RESUME_PENDING,
    RESUMED,
    STOPPED,
    TAG_API_RUN,
    TAG_DECISION,
    TAG_DECISION_REASON,
    TAG_EXIT_CODE,
    TAG_FAILED_AT,
    TAG_FAILURE,
    TAG_OUTCOME,
    TAG_RESUME_AT,
    TAG_RESUME_FROM,
    TAG_RESUMES,
    TAG_STOP,
    short,
)
from fm_pipeline.dagster_runs.requests import (
    NEXT_SEGMENT,
    RESUME_AFTER_FAILURE,
    RESUME_AFTER_PREEMPTION,
    evaluation_request,
    segment_request,
)
from fm_pipeline.resources.store import ObjectStoreResource
from fm_pipeline.resources.training_policy import TrainingPolicyResource

from fm_pipeline.orchestration import decide_after_failure, registered_job
from fm_pipeline.orchestration.retry import LEASE_HELD
from fm_pipeline.orchestration.segments import SegmentNotRunnable, plan_segment
from fm_pipeline.orchestration.submissions import stop_of

SEGMENT_ASSET = "training_segment"


def carried(tags) -> dict[str, str]:
    """The tags a following segment inherits from the run before it (the API's run)."""
    return {k: tags[k] for k in CARRIED_TAGS if k in tags}


def stop_asked(run, store) -> str | None:
    """How a control plane stopped this segment run's training run (preempt | cancel), from
    the run's tag or the stop it recorded in the store (which may come before the tag)."""
    if run.tags.get(TAG_STOP):
        return run.tags[TAG_STOP]
    number, name = run.tags.get(TAG_API_RUN, ""), run.tags.get(PARTITION_TAG)
    if not (number.isdigit() and name):
        return None
    stop = stop_of(store, name, int(number))
    return stop.how if stop else None


def resume_request(job, *, failed_run_id: str, outcome: str, store, site,
                   tags=None) -> RunRequest | None:
    """The segment that continues from the newest valid checkpoint; None at the target.
    `tags`: the failed run's, whose carried tags the resume keeps."""
    try:
        plan = plan_segment(job, store, site=site)
    except SegmentNotRunnable:  # at the target already
        return None
    trigger = RESUME_AFTER_PREEMPTION if outcome == "preempted" else RESUME_AFTER_FAILURE
    return segment_request(job, plan, trigger=trigger, run_key=f"resume-{failed_run_id}",
                           tags={**carried(tags or {}), TAG_RESUMES: failed_run_id,
                                 TAG_RESUME_FROM: short(plan.checkpoint or "scratch")})


def _record(instance, job_name: str, run_id: str, tags: dict[str, str]) -> None:
    """The decision on the failed run (tags) and in the partition's history (observation)."""
    instance.add_run_tags(run_id, tags)
    instance.report_runless_asset_event(AssetObservation(
        asset_key=SEGMENT_ASSET, partition=job_name,
        description=f"segment run {run_id[:8]}: {tags[TAG_DECISION]}",
        metadata={"run_id": run_id, **{k.removeprefix("fm/"): v for k, v in tags.items()}}))


@run_failure_sensor(name="segment_failure_sensor", monitored_jobs=[training_segment_job],
                    request_job=training_segment_job, minimum_interval_seconds=1,
                    default_status=DefaultSensorStatus.RUNNING)
def segment_failure_sensor(context: RunFailureSensorContext, store: ObjectStoreResource,
                           training_policy: TrainingPolicyResource):
    """Resume a failed segment from the newest valid checkpoint, within the retry budget."""
    run = context.dagster_run
    name = run.tags.get(PARTITION_TAG)
    if not name:
        return SkipReason(f"run {run.run_id} has no training job partition")
    instance = context.instance
    record = instance.get_run_record_by_id(run.run_id)
    failed = attempt_of(instance, record)
    if failed is None:  # the event arrived before the run's status was stored
        return SkipReason(f"run {run.run_id} has not finished yet")
    earlier = [a for a in attempts(instance, name) if a.run_id != run.run_id]
    decision = decide_after_failure(failed, earlier=earlier,
                                    policy=training_policy.retry_policy())
    tags = {TAG_OUTCOME: failed.outcome, TAG_EXIT_CODE: str(failed.exit_code),
            TAG_FAILED_AT: str(failed.failed_at_step if failed.failed_at_step is not None
                               else -1),
            TAG_FAILURE: short(failed.reason), TAG_DECISION_REASON: short(decision.reason)}
    context.log.info(f"{name}: run {run.run_id[:8]} {failed.outcome}: {decision.reason}")
    stop = stop_asked(record.dagster_run, store.open())  # fresh: it may postdate the event
    if stop:  # the control plane stopped it: it, not the retry policy, decides what next
        reason = f"stopped by the control plane ({stop}); it decides when the job resumes"
        _record(instance, name, run.run_id, {**tags, TAG_DECISION: STOPPED,
                                             TAG_DECISION_REASON: reason})
        return SkipReason(f"{name}: {reason}")
    if not decision.resume:
        _record(instance, name, run.run_id, {**tags, TAG_DECISION: STOPPED})
        return SkipReason(f"{name}: stopped: {decision.reason}")
    if decision.not_before > time.time():
        _record(instance, name, run.run_id, {**tags, TAG_DECISION: RESUME_PENDING,
                                             TAG_RESUME_AT: f"{decision.not_before:.3f}"})
        return SkipReason(f"{name}: resume after backoff, at {decision.not_before:.0f}")
    job = registered_job(store.open(), name)
    request = resume_request(job, failed_run_id=run.run_id, outcome=failed.outcome,
                             store=store.open(), site=store.site(), tags=run.tags)
    if request is None:
        _record(instance, name, run.run_id, {**tags, TAG_DECISION: STOPPED,
                                             TAG_DECISION_REASON: "target step reached"})
        return SkipReason(f"{name}: the job reached its target step; nothing to resume")
    _record(instance, name, run.run_id, {**tags, TAG_DECISION: RESUMED})
    return request


@sensor(name="segment_progress_sensor", job=training_segment_job, minimum_interval_seconds=1,
        default_status=DefaultSensorStatus.RUNNING)
def segment_progress_sensor(context: SensorEvaluationContext, store: ObjectStoreResource):
    """Start each job's next segment after a successful one, until the target step; start
    the resumes whose backoff has passed."""
    instance, target, site = context.instance, store.open(), store.site()
    requests, notes = [], []
    for name in instance.get_dynamic_partitions(JOBS_PARTITION):
        # A duplicate launch refused by the job's lease says nothing about the job's line.
        records = [r for r in segment_run_records(instance, name, limit=5)
                   if r.dagster_run.tags.get(TAG_OUTCOME) != LEASE_HELD]
        if not records:
            continue
        run = records[0].dagster_run
        stop = stop_asked(run, target)
        if stop:
            notes.append(f"{name}: stopped by the control plane ({stop})")
            continue
        if run.status == DagsterRunStatus.SUCCESS:
            job = registered_job(target, name)
            try:
                plan = plan_segment(job, target, site=site)
            except SegmentNotRunnable:
                notes.append(f"{name}: at its target step {job.training.steps}")
                continue
            requests.append(segment_request(
                job, plan, trigger=NEXT_SEGMENT,
                run_key=f"next-after-{run.run_id}", tags=carried(run.tags)))
        elif run.status == DagsterRunStatus.FAILURE and \
                run.tags.get(TAG_DECISION) == RESUME_PENDING:
            resume_at = float(run.tags.get(TAG_RESUME_AT, "0"))
            if resume_at > time.time():
                notes.append(f"{name}: resume in {resume_at - time.time():.0f} s")
                continue
            job = registered_job(target, name)
            request = resume_request(job, failed_run_id=run.run_id,
                                     outcome=run.tags.get(TAG_OUTCOME, "failed"), store=target,
                                     site=site, tags=run.tags)
            instance.add_run_tags(run.run_id, {TAG_DECISION: RESUMED})
            if request is not None:
                requests.append(request)
    if requests:
        return SensorResult(run_requests=requests)
    return SkipReason("; ".join(notes) or "no segment to start")


@sensor(name="checkpoint_evaluation_sensor", job=checkpoint_evaluation_job,
        minimum_interval_seconds=1, default_status=DefaultSensorStatus.RUNNING)
def checkpoint_evaluation_sensor(context: SensorEvaluationContext):
    """Evaluate every newly recorded checkpoint: one run per job for the checkpoints one
    segment run recorded (a worker's start-up, torch's import and the run's own start are
    paid once, not per checkpoint)."""
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=CHECKPOINT, after_storage_id=after),
        limit=100, ascending=True).records
    if not records:
        return SkipReason("no new checkpoint")
    batches: dict[tuple[str, str], set[int]] = {}
    for record in records:
        name = record.asset_materialization.partition
        if name:
            step = record.asset_materialization.metadata["step"].value
            batches.setdefault((name, record.event_log_entry.run_id), set()).add(step)
    requests = [evaluation_request(name, steps) for (name, _), steps in batches.items()]
    return SensorResult(run_requests=requests, cursor=str(records[-1].storage_id))


TRAINING_SENSORS = [run_intake_sensor, segment_failure_sensor, segment_progress_sensor,
                    checkpoint_evaluation_sensor]
