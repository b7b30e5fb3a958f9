"""`training_segment`: one torchrun segment of a training job, launched through the launcher
resource (local torchrun by default, a Kubernetes JobSet with FM_LAUNCHER=kubernetes).

Each materialization of a job's partition is one segment: its step range, loss, MFU,
tokens/s and goodput, the predicted step time and MFU of the job's plan (the
`training_plan` partition it takes as input) beside the measured ones, and the checkpoint
it ended on. Where it starts and ends, and what refuses it, is
fm_pipeline.orchestration.segments; this asset adds the run's context. Rank 0's summary
arrives through Dagster Pipes and becomes the metadata. A segment that does not reach its end step raises dagster.Failure carrying the
launcher's recovered outcome, exit code and reason plus the step it failed at: the
failure sensor (sensors.py) reads them to decide whether and when to resume. A run
terminated (the UI, the API's preempt or cancel) stops its segment at a checkpoint first
(exit 75) and ends canceled, its outcome in the tags fm/outcome, fm/exit_code and
fm/outcome_reason. A segment of a training run a control plane stopped does not launch.

Run config (ops.training_segment.config): end_step (0: the next segment boundary after the
checkpoint it starts from), fail_at ("RANK:STEP" fault injection, FM_FAULT_FAIL_AT; or a
fault planted for the job, orchestration.registry.plant_fault),
resume_from (a committed checkpoint of the job, directory or store location, to start from
instead of the newest valid one: a rollback), planned_start (the request's plan:
orchestration.segments.plan_segment; the trainer gets it as --resume-from ... --planned).
"""

import time

from dagster import (
    AssetExecutionContext,
    AssetIn,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    ResourceParam,
    asset,
)
from fm_pipeline.dagster_runs.names import (
    GROUP,
    TAG_API_RUN,
    TAG_EXIT_CODE,
    TAG_OUTCOME,
    TAG_OUTCOME_REASON,
    TAG_STOP,
    short,
    training_jobs,
)
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher
from fm_pipeline.resources.launcher_local import LocalLauncher
from fm_pipeline.resources.mlflow import MlflowTrackingResource
from fm_pipeline.resources.store import ObjectStoreResource
from pydantic import Field

from fm_pipeline.launch.pod import Placement
from fm_pipeline.orchestration import registered_job, segment_report
from fm_pipeline.orchestration.registry import take_fault
from fm_pipeline.orchestration.segments import (
    SegmentNotRunnable,
    failure_metadata,
    prepare_segment,
)
from fm_pipeline.rundir.records import METRICS_FILE, latest_record
from fm_pipeline.train.faults import FAIL_AT_ENV

Launcher = LocalLauncher | KubernetesLauncher  # same launch_segment(); resource "launcher"

# Keys of rank 0's summary worth a column in the UI (the rest stays in MLflow / JSON lines).
_SUMMARY_KEYS = ("start_step", "end_step", "final_loss", "mean_mfu", "tokens_per_s",
                 "tokens_seen", "checkpoint", "restored_from", "resharded", "restore_s",
                 "checkpoint_block_s", "world_size", "accelerator", "duration_s", "segment_dir",
                 "restored_tier", "inplace_restarts", "inplace_cause", "inplace_restore_s",
                 "inplace_steps_redone")


class SegmentConfig(Config):
    end_step: int = Field(default=0, ge=0, description=(
        "train up to this step; 0: the next multiple of training.segment_steps after the "
        "newest valid checkpoint"))
    fail_at: str = Field(default="", description=(
        "fault injection RANK:STEP: that rank raises after STEP (local launcher; demo, drills)"))
    resume_from: str = Field(default="", description=(
        "start from this committed checkpoint (directory or store location) instead of the "
        "newest valid one; empty: the newest valid"))
    planned_start: str = Field(default="", description=(
        "the checkpoint the request's plan starts from ('scratch': none; empty: plan now); "
        "checked at launch, replanned (and recorded) if a checkpoint came or went since"))


def _values(metadata) -> dict:
    return {k: getattr(v, "value", v) for k, v in (metadata or {}).items()}


@asset(partitions_def=training_jobs, group_name=GROUP, kinds={"pytorch"},
       ins={"training_plan": AssetIn()})
def training_segment(context: AssetExecutionContext, config: SegmentConfig,
                     training_plan: dict | None, launcher: ResourceParam[Launcher],
                     store: ObjectStoreResource,
                     mlflow: MlflowTrackingResource) -> MaterializeResult:
    """One torchrun segment of the partition's training job, from its newest valid checkpoint
    to the next segment boundary; metadata: steps, loss, MFU, goodput, plan vs measured."""
    target, site = store.open(), store.site()
    job = registered_job(target, context.partition_key)
    api_run = context.run.tags.get(TAG_API_RUN, "")
    try:
        segment = prepare_segment(job, target, site=site, end_step=config.end_step,
                                  resume_from=config.resume_from,
                                  planned_start=config.planned_start,
                                  api_run=int(api_run) if api_run.isdigit() else None,
                                  target="kubernetes" if isinstance(launcher, KubernetesLauncher)
                                  else "local")
    except SegmentNotRunnable as e:
        if "stop" in e.metadata:  # the sensors must leave it to the control plane
            context.instance.add_run_tags(context.run_id, {TAG_STOP: e.metadata["stop"]})
        raise Failure(description=str(e), metadata=e.metadata, allow_retries=False) from None
    plan = training_plan
    if segment.start == 0 and plan is not None:
        mlflow.log_plan(job, plan)
    ml_run = mlflow.start_segment_run(job, segment=segment.name, end_step=segment.end,
                                      start_step=segment.start, dagster_run_id=context.run_id)
    env = {**mlflow.trainer_env(ml_run), **segment.launch_env}
    if segment.exclusion is not None:
        context.log.warning(f"{job.name}: straggler exclusion applied: {segment.exclusion.note}")
        mlflow.note_exclusion(ml_run, segment.exclusion.note)
    fault = config.fail_at or take_fault(target, job.name, start=segment.start, end=segment.end)
    if fault:
        env[FAIL_AT_ENV] = fault
    context.log.info(f"{job.name}: segment steps {segment.start} -> {segment.end} "
                     f"(resuming from {segment.resume_from or 'scratch'})")
    launched_at = time.time()
    try:
        placement = Placement(avoid_hosts=segment.avoid_hosts) if segment.avoid_hosts else None
        run = launcher.launch_segment(
            context, job=segment.launch_job, end_step=segment.end, env=env,
            resume_from=segment.resume_from, planned=not segment.chosen, placement=placement,
            extras={"job": job.name, "start_step": segment.start, "end_step": segment.end})
    except BaseException as e:
        if not isinstance(e, Failure):  # terminated, or the launcher itself broke
            if _interrupted(e):
                _record_termination(context, e, ml_run, mlflow)
            else:
                mlflow.finish_segment(ml_run, outcome="failed", failure_reason=repr(e))
            raise
        failure = _values(e.metadata)
        mlflow.finish_segment(ml_run, outcome=str(failure.get("outcome", "failed")),
                              failure_reason=e.description)
        record = latest_record(site.runs_dir(job.name) / METRICS_FILE, "step")
        failed_at = record["step"] if record.get("time", 0) >= launched_at else None
        raise Failure(description=e.description, allow_retries=False, metadata=failure_metadata(
            segment, e.metadata, failed_at_step=failed_at, mlflow_run=ml_run)) from e
    reported = run.materialize_result()
    # The launch's start: an in-job restart's rank 0 reports the step it restored instead.
    summary = {"end_step": segment.end, **_values(reported.metadata),
               "start_step": segment.start}
    report = segment_report(job, summary, duration_s=run.result.duration_s, plan=plan)
    report["job_goodput"] = _job_goodput(context.instance, job.name, report,
                                         reached_step=summary["end_step"])
    mlflow.finish_segment(ml_run, outcome="succeeded", summary={
        k: summary[k] for k in _SUMMARY_KEYS if k in summary})
    metadata = _metadata(job, summary, report, resume_from=segment.resume_from, ml_run=ml_run,
                         mlflow=mlflow)
    if segment.exclusion is not None:
        metadata.update(_exclusion_metadata(segment.exclusion))
    return MaterializeResult(metadata=metadata)


def _exclusion_metadata(plan) -> dict:
    """The straggler decision this launch applied: which slots, why, and what it became."""
    rows = ["| host | local rank | rank | evidence |", "|---|---|---|---|"]
    rows += [f"| {s.host} | {s.local_rank} | {s.rank} | {s.reason} |" for s in plan.excluded]
    return {"stragglers_excluded": MetadataValue.md("\n".join(rows)),
            "straggler_action": plan.note,
            "launched_world_size": plan.job.parallelism.world_size}


def _interrupted(e: BaseException) -> bool:
    """The run was terminated (the UI, the API's preempt/cancel: Dagster interrupts the op)."""
    from dagster import DagsterExecutionInterruptedError

    return isinstance(e, (DagsterExecutionInterruptedError, KeyboardInterrupt))


def _record_termination(context, e: BaseException, ml_run, mlflow) -> None:
    """What the stopped segment did (the launcher stopped it at a checkpoint first), on the
    run's tags: the run itself ends canceled, without the metadata a Failure carries."""
    result = getattr(e, "segment_result", None)
    if result is None:  # a launcher that could not say (e.g. it never started)
        mlflow.finish_segment(ml_run, outcome="cancelled", failure_reason="terminated")
        return
    mlflow.finish_segment(ml_run, outcome=result.outcome.value, failure_reason=result.reason)
    context.instance.add_run_tags(context.run_id, {
        TAG_OUTCOME: result.outcome.value, TAG_EXIT_CODE: str(result.exit_code),
        TAG_OUTCOME_REASON: short(result.reason)})
    context.log.info(f"terminated: the segment stopped {result.outcome.value} "
                     f"(exit {result.exit_code}): {result.reason}")


def _job_goodput(instance, job_name: str, report: dict, *, reached_step: int) -> float | None:
    """The job's goodput including this segment: steps reached x median step time over
    the wall time of every launch so far (failed ones included)."""
    from fm_pipeline.dagster_runs.history import attempts

    from fm_pipeline.orchestration import job_goodput

    earlier = attempts(instance, job_name)
    step_times = [a.step_time_s for a in earlier if a.step_time_s] + [report["step_time_s"]]
    walls = [a.wall_s for a in earlier if a.wall_s] + [report["wall_s"]]
    return job_goodput(reached_step=reached_step, step_times_s=[t for t in step_times if t],
                       launch_wall_s=walls)


def _metadata(job, summary: dict, report: dict, *, resume_from, ml_run, mlflow) -> dict:
    start, end = summary.get("start_step"), summary.get("end_step")
    data = {
        "job": job.name, "step_range": MetadataValue.text(f"{start} -> {end}"),
        "start_step": start, "end_step": end, "target_step": job.training.steps,
        "resumed_from": resume_from or "scratch",
        **{k: summary[k] for k in _SUMMARY_KEYS if k in summary and summary[k] is not None
           and k not in ("start_step", "end_step")},
        **{k: v for k, v in report.items() if v is not None},
        "mlflow_run_id": ml_run,
    }
    if summary.get("checkpoint"):
        data["checkpoint"] = MetadataValue.path(str(summary["checkpoint"]))
    url = mlflow.run_url(ml_run)
    if url:
        data["mlflow"] = MetadataValue.url(url)
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in data.items()}
