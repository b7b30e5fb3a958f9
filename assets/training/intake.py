"""`run_intake_sensor`: the daemon starts the runs control planes ask for.

A control plane (the REST API, `fm demo`) records a submission in the store
(fm_pipeline.orchestration.submissions) and never executes a run itself; this sensor turns
each submission into a run with the submission's tags and run key: a "train" submission into
the job's first segment run (from the checkpoint it names, else the newest valid one),
"data_mix" into a data_mix_job run for the job's spec, "drill" into a restore drill of its
newest checkpoint. A train submission a control plane stopped before it started is skipped;
one that cannot start (an unknown checkpoint, nothing left to train) is rejected with the
reason (submissions.reject), which the API reports. The daemon never starts one key twice,
so two control planes, a restarted daemon or a tick evaluated again start each run once.
It also adds the job's partition if a control plane could not.
"""

from dagster import (
    AddDynamicPartitionsRequest,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from fm_pipeline.assets.data import data_mix_job, data_run_config
from fm_pipeline.dagster_runs.history import recorded_checkpoints
from fm_pipeline.assets.training.jobs import restore_drill_job, training_segment_job
from fm_pipeline.dagster_runs.names import (
    DRILL_JOB,
    JOBS_PARTITION,
    RUN_KEY_TAG,
    SEGMENT_JOB,
    TAG_API_RUN,
    TAG_JOB,
    TAG_RESUME_FROM,
    short,
)
from fm_pipeline.dagster_runs.requests import (
    API_RESUME,
    SUBMIT,
    checkpoint_request,
    segment_request,
)
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.orchestration import registered_job
from fm_pipeline.orchestration.segments import plan_segment
from fm_pipeline.orchestration.submissions import reject, stop_of, submissions

# Submissions are looked at again for this long after the newest one seen: a control plane
# whose record lands late (written earlier, visible later) is not missed; run keys make the
# second look harmless.
LOOKBACK_S = 120.0


def submission_request(submission, store, instance, *, site) -> RunRequest | None:
    """The run `submission` asks for; None when there is nothing to run (a job at its
    target step, a drill of a job without checkpoints)."""
    if submission.kind == "data_mix":
        spec = registered_job(store, submission.job)
        return RunRequest(run_key=submission.run_key, job_name=data_mix_job.name,
                          run_config={**data_run_config(spec), "resources": {"job_spec": {
                              "config": {"registered": submission.job}}}},
                          tags={TAG_JOB: submission.job, **submission.tags})
    if submission.kind == "drill":
        newest = recorded_checkpoints(instance, submission.job, limit=1)
        if not newest:
            return None
        request = checkpoint_request(submission.job, newest[0]["step"], kind="drill")
        return request.with_replaced_attrs(run_key=submission.run_key, job_name=DRILL_JOB,
                                           tags={**request.tags, **submission.tags})
    job = registered_job(store, submission.job)
    tags = {**submission.tags, TAG_API_RUN: str(submission.number)}
    plan = plan_segment(job, store, site=site, resume_from=submission.resume_from)
    if plan.checkpoint:
        tags[TAG_RESUME_FROM] = short(plan.checkpoint)
    request = segment_request(job, plan, trigger=API_RESUME if submission.number > 1 else SUBMIT,
                              run_key=submission.run_key, tags=tags, fail_at=submission.fail_at)
    return request.with_replaced_attrs(job_name=SEGMENT_JOB)


def _started(instance, submission) -> bool:
    """A run with the submission's key exists (a later look at a started one is no
    rejection: by then its job may have reached the target)."""
    return bool(instance.get_run_ids(RunsFilter(tags={RUN_KEY_TAG: submission.run_key}),
                                     limit=1))


@sensor(name="run_intake_sensor", minimum_interval_seconds=1,
        jobs=[training_segment_job, data_mix_job, restore_drill_job],
        default_status=DefaultSensorStatus.RUNNING)
def run_intake_sensor(context: SensorEvaluationContext, store: ObjectStoreResource):
    """Start the first segment of every run a control plane submitted."""
    seen = float(context.cursor or 0.0)
    target = store.open()
    requests, notes, partitions = [], [], set()
    pending = submissions(target, after=seen - LOOKBACK_S)
    for submission in pending:
        if submission.kind == "train" and stop_of(target, submission.job, submission.number):
            notes.append(f"{submission.run_key}: stopped before it started")
            continue
        try:
            request = submission_request(submission, target, context.instance,
                                         site=store.site())
        except ValueError as e:  # an unknown job or checkpoint: nothing to start, say why
            notes.append(f"{submission.run_key}: {e}")
            if submission.kind == "train" and not _started(context.instance, submission):
                reject(target, submission.job, submission.number, str(e))
            continue
        if request is None:
            notes.append(f"{submission.run_key}: nothing to run")
            continue
        if submission.kind != "data_mix" and not context.instance.has_dynamic_partition(
                JOBS_PARTITION, submission.job):
            partitions.add(submission.job)
        requests.append(request)
    cursor = str(max([seen, *(s.at for s in pending)]))
    if not requests:
        return SensorResult(skip_reason=SkipReason("; ".join(notes) or "no submission"),
                            cursor=cursor)
    return SensorResult(run_requests=requests, cursor=cursor, dynamic_partitions_requests=[
        AddDynamicPartitionsRequest(JOBS_PARTITION, sorted(partitions))] if partitions else [])
