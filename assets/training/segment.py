"""`training_segment`: one torchrun segment of a training job, launched through the launcher
resource (local torchrun by default, a Kubernetes JobSet with FM_LAUNCHER=kubernetes).

Each materialization of a job's partition is one segment: its step range, loss, MFU,
tokens/s and goodput, the plan's predicted step time and MFU beside the measured ones, and
the checkpoint it ended on. Rank 0's summary arrives through Dagster Pipes and becomes the
metadata. A segment that does not reach its end step raises dagster.Failure carrying the
launcher's recovered outcome, exit code and reason plus the step it failed at: the
failure sensor (sensors.py) reads them to decide whether and when to resume.

Run config (ops.training_segment.config): end_step (0: the next segment boundary after the
checkpoint it starts from), fail_at ("RANK:STEP" fault injection, FM_FAULT_FAIL_AT),
resume_from (a committed checkpoint of the job, directory or store location, to start from
instead of the newest valid one: the trainer's --resume-from).
"""

import time

from dagster import (
    AssetExecutionContext,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    ResourceParam,
    asset,
)
from fm_pipeline.assets.plan import training_plan
from fm_pipeline.assets.training.names import GROUP, training_jobs
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher
from fm_pipeline.resources.launcher_local import LocalLauncher
from fm_pipeline.resources.mlflow import MlflowTrackingResource
from fm_pipeline.resources.store import ObjectStoreResource
from pydantic import Field

from fm_pipeline.orchestration import registered_job, segment_end, segment_report

Launcher = LocalLauncher | KubernetesLauncher  # same launch_segment(); resource "launcher"

# Keys of rank 0's summary worth a column in the UI (the rest stays in MLflow / JSON lines).
_SUMMARY_KEYS = ("start_step", "end_step", "final_loss", "mean_mfu", "tokens_per_s",
                 "tokens_seen", "checkpoint", "restored_from", "resharded", "restore_s",
                 "checkpoint_block_s", "world_size", "accelerator", "duration_s", "segment_dir")


class SegmentConfig(Config):
    end_step: int = Field(default=0, ge=0, description=(
        "train up to this step; 0: the next multiple of training.segment_steps after the "
        "newest valid checkpoint"))
    fail_at: str = Field(default="", description=(
        "fault injection RANK:STEP: that rank raises after STEP (local launcher; demo, drills)"))
    resume_from: str = Field(default="", description=(
        "start from this committed checkpoint (directory or store location) instead of the "
        "newest valid one; empty: the newest valid"))


def newest_valid_step(job, store) -> tuple[int, str | None]:
    """(step, location) of the checkpoint the next segment resumes from; (0, None) if none."""
    from fm_pipeline.catalog import latest_valid

    found = latest_valid(job, store=store, checksums=False)
    return (found.found.step, found.found.location) if found.found else (0, None)


def checkpoint_step(job, store, location: str) -> int:
    """The step of the job's checkpoint at `location` (either tier); ValueError if it is not
    one of the job's checkpoints."""
    from fm_pipeline.catalog.validate import candidates

    refs = candidates(job.name, store=store)
    for ref in refs:
        if ref.location.rstrip("/") == location.rstrip("/"):
            return ref.step
    known = ", ".join(sorted({r.location for r in refs})) or "none"
    raise ValueError(f"resume_from {location!r} is not a checkpoint of job {job.name} "
                     f"(its checkpoints: {known})")


def _failed_at_step(job_name: str, since: float) -> int | None:
    """The last step rank 0 logged after `since` (local runs; None on a pod or before any)."""
    from fm_pipeline.api.progress import latest_metrics

    record = latest_metrics(job_name)
    return record["step"] if record and record.get("time", 0) >= since else None


def _plan(job) -> dict | None:
    from fm_pipeline.planner.job_plan import plan_for_job

    try:
        return plan_for_job(job)
    except ValueError:  # a layout the planner cannot model: report the segment without it
        return None


def _values(metadata) -> dict:
    return {k: getattr(v, "value", v) for k, v in (metadata or {}).items()}


@asset(partitions_def=training_jobs, group_name=GROUP, deps=[training_plan],
       kinds={"pytorch"})
def training_segment(context: AssetExecutionContext, config: SegmentConfig,
                     launcher: ResourceParam[Launcher], store: ObjectStoreResource,
                     mlflow: MlflowTrackingResource) -> MaterializeResult:
    """One torchrun segment of the partition's training job, from its newest valid checkpoint
    to the next segment boundary; metadata: steps, loss, MFU, goodput, plan vs measured."""
    from fm_pipeline.data import DataError, open_job_mix

    target = store.open()
    job = registered_job(target, context.partition_key)
    if config.resume_from:
        try:
            start = checkpoint_step(job, target, config.resume_from)
        except ValueError as e:
            raise Failure(description=str(e), allow_retries=False, metadata={
                "outcome": "bad_config", "reason": str(e)}) from None
        resume_from = config.resume_from
    else:
        start, resume_from = newest_valid_step(job, target)
    end = config.end_step or segment_end(job, start)
    if start >= job.training.steps or end <= start:
        raise Failure(description=(f"job {job.name} is at step {start}; a segment to step {end} "
                                   f"has nothing to train (target {job.training.steps})"),
                      metadata={"outcome": "bad_config", "start_step": start, "end_step": end},
                      allow_retries=False)
    try:
        open_job_mix(job, target)
    except DataError as e:
        raise Failure(description=f"data mix of {job.name} is not ready: {e}; materialize "
                                  "data_mix for this job spec first",
                      metadata={"outcome": "bad_config", "reason": str(e)}, allow_retries=False)
    plan = _plan(job)
    if start == 0 and plan is not None:
        mlflow.log_plan(job, plan)
    ml_run = mlflow.start_segment_run(job, segment=f"steps-{start}-{end}", end_step=end,
                                      start_step=start, dagster_run_id=context.run_id)
    env = mlflow.trainer_env(ml_run)
    if config.fail_at:
        from fm_pipeline.train.trainer import FAIL_AT_ENV

        env[FAIL_AT_ENV] = config.fail_at
    context.log.info(f"{job.name}: segment steps {start} -> {end} "
                     f"(resuming from {resume_from or 'scratch'})")
    launched_at = time.time()
    chosen = {"resume_from": config.resume_from} if config.resume_from else {}
    try:
        run = launcher.launch_segment(
            context, job=job, end_step=end, env=env, **chosen,
            extras={"job": job.name, "start_step": start, "end_step": end})
    except BaseException as e:
        if not isinstance(e, Failure):  # cancelled, or the launcher itself broke
            mlflow.finish_segment(ml_run, outcome="cancelled" if isinstance(
                e, KeyboardInterrupt) else "failed", failure_reason=repr(e))
            raise
        failed_at = _failed_at_step(job.name, launched_at)
        failure = _values(e.metadata)
        mlflow.finish_segment(ml_run, outcome=str(failure.get("outcome", "failed")),
                              failure_reason=e.description)
        raise Failure(description=e.description, allow_retries=False, metadata={
            **(e.metadata or {}), "start_step": start, "end_step": end,
            "failed_at_step": failed_at if failed_at is not None else -1,
            "resume_from": resume_from or "scratch", "mlflow_run_id": ml_run}) from e
    reported = run.materialize_result()
    summary = {"start_step": start, "end_step": end, **_values(reported.metadata)}
    report = segment_report(job, summary, duration_s=run.result.duration_s, plan=plan)
    report["job_goodput"] = _job_goodput(context.instance, job.name, report,
                                         reached_step=summary["end_step"])
    mlflow.finish_segment(ml_run, outcome="succeeded", summary={
        k: summary[k] for k in _SUMMARY_KEYS if k in summary})
    return MaterializeResult(metadata=_metadata(job, summary, report, resume_from=resume_from,
                                                ml_run=ml_run, mlflow=mlflow))


def _job_goodput(instance, job_name: str, report: dict, *, reached_step: int) -> float | None:
    """The job's goodput including this segment: steps reached x median step time over
    the wall time of every launch so far (failed ones included)."""
    from fm_pipeline.assets.training.history import attempts

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
