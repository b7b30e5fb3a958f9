"""`restore_drill_schedule`: on a cron (FM_DRILL_CRON, default every 6 hours), drill the
newest checkpoint of every job whose newest checkpoint has not been drilled yet (a job that
has not checkpointed since its last drill is idle and is left alone), nor asked to be: a
drill still queued behind the job's runs when the next tick comes is not asked for twice
(a schedule's run key, unlike a sensor's, does not stop a second run across ticks).
"""

import os

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DefaultScheduleStatus,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)
from fm_pipeline.dagster_runs.history import recorded_checkpoints
from fm_pipeline.assets.training.jobs import restore_drill_job
from fm_pipeline.dagster_runs.names import JOBS_PARTITION, RUN_KEY_TAG
from fm_pipeline.dagster_runs.requests import checkpoint_request

DRILL_CRON_ENV = "FM_DRILL_CRON"
DEFAULT_DRILL_CRON = "0 */6 * * *"


def drill_cron() -> str:
    cron = os.environ.get(DRILL_CRON_ENV, DEFAULT_DRILL_CRON).strip()
    if len(cron.split()) != 5:
        raise ValueError(f"{DRILL_CRON_ENV}={cron!r}: expected a 5-field cron expression, "
                         f"e.g. {DEFAULT_DRILL_CRON!r}")
    return cron


def last_drilled_step(instance, job_name: str) -> int | None:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("restore_drill"), asset_partitions=[job_name]),
        limit=1, ascending=False).records
    if not records:
        return None
    return records[0].asset_materialization.metadata["checkpoint_step"].value


def drill_requested(instance, run_key: str) -> bool:
    """Whether a run with this run key exists (queued, running or ended), from this schedule
    or from a submission."""
    return bool(instance.get_run_ids(filters=RunsFilter(tags={RUN_KEY_TAG: run_key}),
                                     limit=1))


@schedule(name="restore_drill_schedule", cron_schedule=drill_cron(), job=restore_drill_job,
          default_status=DefaultScheduleStatus.RUNNING)
def restore_drill_schedule(context: ScheduleEvaluationContext):
    """Drill the newest checkpoint of each job that checkpointed since its last drill."""
    requests = []
    for name in context.instance.get_dynamic_partitions(JOBS_PARTITION):
        newest = recorded_checkpoints(context.instance, name, limit=1)
        if not newest:
            continue
        drilled = last_drilled_step(context.instance, name)
        if drilled is None or drilled < newest[0]["step"]:
            request = checkpoint_request(name, newest[0]["step"], kind="drill")
            if not drill_requested(context.instance, request.run_key):
                requests.append(request)
    return requests or SkipReason("every job's newest checkpoint has been drilled or has a "
                                  "drill on its way")
