"""One training job's MLflow record: a parent run per job, a child run per segment,
evaluation and restore drill. The Dagster resource (fm_pipeline.resources.mlflow) is a thin
wrapper around this class; scripts and tests can use it directly.

    tracker = JobTracker("http://127.0.0.1:5000")          # or "sqlite:///.fm/mlflow.db"
    parent = tracker.job_run(job)                           # found or created; job spec params
    tracker.log_plan(job, plan)                             # plan.* params + plan.json
    run_id = tracker.start_segment_run(job, segment="to-40", end_step=40,
                                       dagster_run_id=context.run_id)
    env = tracker.trainer_env(run_id)                       # rank 0 logs per-step metrics
    ...                                                     # torchrun -m fm_pipeline.train
    tracker.finish_segment(run_id, outcome="succeeded", summary=segment_summary)
    tracker.log_evaluation(job, checkpoint_step=40, checkpoint_uri=uri,
                           metrics={"prose/loss": 3.1}, dagster_run_id=context.run_id)
    tracker.log_drill(job, checkpoint_step=40, checkpoint_uri=uri, passed=True, ...)
    tracker.finish_job(job)

Runs are found by tags (fm.kind, fm.job, fm.segment, dagster.run_id; see names.py), so
each call is idempotent and any process finds what another created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fm_pipeline.config import JobSpec, dump_job
from fm_pipeline.tracking import names, runs
from fm_pipeline.tracking.params import flatten_params, mask_url_credentials

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

# Segment outcomes (fm_pipeline.launch.outcome.Outcome values, or the trainer's exit_reason
# "completed") -> MLflow run status; anything else is FAILED.
_OUTCOME_STATUS = {"succeeded": "FINISHED", "completed": "FINISHED", "preempted": "KILLED",
                   "cancelled": "KILLED", "timed_out": "KILLED"}

# Summary fields that are not measurements (steps are tags; "time" is the record's stamp).
_NOT_SUMMARY_METRICS = {"start_step", "end_step", "time", "exit_code"}


class JobTracker:
    def __init__(self, tracking_uri: str, *, experiment: str = names.DEFAULT_EXPERIMENT):
        if not tracking_uri:
            raise ValueError("an MLflow tracking URI is required (http://host:port or "
                             "sqlite:///path/mlflow.db)")
        if not experiment:
            raise ValueError("an MLflow experiment name is required")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self._client: MlflowClient | None = None
        self._experiment_id: str | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = runs.open_client(self.tracking_uri)
        return self._client

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = runs.experiment_id(self.client, self.experiment)
        return self._experiment_id

    # -- the job's parent run ------------------------------------------------------------

    def find_job_run(self, job_name: str) -> Run | None:
        return runs.find_run(self.client, self.experiment_id,
                             {names.TAG_KIND: names.KIND_JOB, names.TAG_JOB: job_name})

    def job_run(self, job: JobSpec) -> str:
        """The job's parent run id, created (with the whole job spec as params and as
        job.json) the first time."""
        found = self.find_job_run(job.name)
        if found is not None:
            return found.info.run_id
        run_id = runs.create_run(self.client, self.experiment_id, run_name=job.name, tags={
            names.TAG_KIND: names.KIND_JOB, names.TAG_JOB: job.name,
            names.TAG_TENANT: job.tenant, names.TAG_OWNER: job.owner,
            names.TAG_PRIORITY: job.priority})
        spec = dump_job(job)
        runs.log_params(self.client, run_id, flatten_params({"job": spec}))
        self.client.log_dict(run_id, _redacted_document(spec), "job.json")
        return run_id

    def log_plan(self, job: JobSpec, plan: Mapping[str, Any]) -> None:
        """The planner's plan as plan.* params of the parent run, whole as plan.json."""
        parent = self.job_run(job)
        runs.log_params(self.client, parent, flatten_params({"plan": plan}))
        self.client.log_dict(parent, _redacted_document(plan), "plan.json")

    def finish_job(self, job: JobSpec, *, status: str = "FINISHED") -> None:
        found = self.find_job_run(job.name)
        if found is None:
            raise ValueError(f"no MLflow run for job {job.name!r} in experiment "
                             f"{self.experiment!r}")
        self.client.set_terminated(found.info.run_id, status=_status(status))

    # -- segments ------------------------------------------------------------------------

    def start_segment_run(self, job: JobSpec, *, segment: str, end_step: int,
                          dagster_run_id: str | None = None,
                          start_step: int | None = None) -> str:
        """The segment's child run (found again for the same segment and Dagster run).
        A finished parent is reopened: the job is training again."""
        parent = self.job_run(job)
        if self.client.get_run(parent).info.status != "RUNNING":
            self.client.update_run(parent, status="RUNNING")
        tags = {names.TAG_KIND: names.KIND_SEGMENT, names.TAG_JOB: job.name,
                names.TAG_SEGMENT: segment}
        if dagster_run_id:
            tags[names.TAG_DAGSTER_RUN] = dagster_run_id
        found = runs.find_run(self.client, self.experiment_id, {**tags, names.TAG_PARENT: parent})
        if found is not None:
            if found.info.status != "RUNNING":
                self.client.update_run(found.info.run_id, status="RUNNING")
            return found.info.run_id
        tags |= {names.TAG_TENANT: job.tenant, names.TAG_END_STEP: str(end_step)}
        if start_step is not None:
            tags[names.TAG_START_STEP] = str(start_step)
        return runs.create_run(
            self.client, self.experiment_id, parent_run_id=parent, tags=tags,
            run_name=names.segment_run_name(job.name, start_step=start_step, end_step=end_step))

    def trainer_env(self, run_id: str) -> dict[str, str]:
        """Environment for the launcher: rank 0 logs per-step metrics into `run_id` and
        leaves ending it to finish_segment (which knows the outcome even if rank 0 died)."""
        run = self.client.get_run(run_id)
        env = {names.ENV_URI: self.tracking_uri, names.ENV_EXPERIMENT: self.experiment,
               names.ENV_RUN_ID: run_id}
        parent = run.data.tags.get(names.TAG_PARENT)
        if parent:
            env[names.ENV_PARENT_RUN_ID] = parent
        return env

    def finish_segment(self, run_id: str, *, outcome: str,
                       summary: Mapping[str, Any] | None = None,
                       failure_reason: str | None = None) -> None:
        """End the segment run: status from `outcome` ("succeeded", "failed", "preempted",
        ...), the trainer's summary (numbers as segment.* metrics at its end step, the
        checkpoint URI as a tag here and on the parent), the failure reason, and the
        segment's step metrics appended to the parent's curves (each point once, also when a
        retried Dagster step finishes the same run again)."""
        summary = dict(summary or {})
        run = self.client.get_run(run_id)
        parent = run.data.tags.get(names.TAG_PARENT)
        end_step = summary.get("end_step")
        tags: dict[str, Any] = {names.TAG_OUTCOME: outcome}
        if failure_reason:
            tags[names.TAG_FAILURE] = mask_url_credentials(failure_reason)[:5000]
        if summary.get("start_step") is not None:
            tags[names.TAG_START_STEP] = summary["start_step"]
        if end_step is not None:
            tags[names.TAG_END_STEP] = end_step
            numbers = {f"segment.{k}": v for k, v in summary.items()
                       if k not in _NOT_SUMMARY_METRICS}
            runs.log_metrics(self.client, run_id, numbers, step=int(end_step))
        checkpoint = summary.get("checkpoint")
        if checkpoint:
            tags[names.TAG_CHECKPOINT_URI] = checkpoint
            if parent and end_step is not None:
                runs.set_tags(self.client, parent,
                              {names.checkpoint_tag(int(end_step)): checkpoint})
        if parent:  # a retried attempt in the same run copies only its own new points
            copied = int(run.data.tags.get(names.TAG_COPIED_MS, -1))
            tags[names.TAG_COPIED_MS] = runs.copy_metric_history(self.client, run_id, parent,
                                                                  after_ms=copied)
        runs.set_tags(self.client, run_id, tags)
        self.client.set_terminated(run_id, status=_OUTCOME_STATUS.get(outcome, "FAILED"))

    def segment_runs(self, job_name: str) -> list[Run]:
        """The job's segment runs, oldest first."""
        return runs.find_runs(self.client, self.experiment_id,
                              {names.TAG_KIND: names.KIND_SEGMENT, names.TAG_JOB: job_name})

    # -- evaluations and drills ----------------------------------------------------------

    def log_evaluation(self, job: JobSpec, *, checkpoint_step: int, checkpoint_uri: str,
                       metrics: Mapping[str, float], dagster_run_id: str | None = None,
                       params: Mapping[str, Any] | None = None) -> str:
        """A finished child run with the evaluation's metrics at the checkpoint's step; the
        parent gets them as eval.<name> so its curves show evaluation against step."""
        run_id = self._checkpoint_child(
            job, kind=names.KIND_EVALUATION, checkpoint_step=checkpoint_step,
            checkpoint_uri=checkpoint_uri, dagster_run_id=dagster_run_id, params=params,
            run_name=names.evaluation_run_name(job.name, checkpoint_step))
        runs.log_metrics(self.client, run_id, metrics, step=checkpoint_step)
        runs.log_metrics(self.client, self.job_run(job),
                         {f"eval.{k}": v for k, v in metrics.items()}, step=checkpoint_step)
        self.client.set_terminated(run_id, status="FINISHED")
        return run_id

    def log_drill(self, job: JobSpec, *, checkpoint_step: int, checkpoint_uri: str,
                  passed: bool, metrics: Mapping[str, float] | None = None,
                  params: Mapping[str, Any] | None = None, dagster_run_id: str | None = None,
                  failure_reason: str | None = None) -> str:
        """A child run for one restore drill (params: e.g. the drill's topology); FAILED
        when the drill did not pass, with its reason."""
        run_id = self._checkpoint_child(
            job, kind=names.KIND_DRILL, checkpoint_step=checkpoint_step,
            checkpoint_uri=checkpoint_uri, dagster_run_id=dagster_run_id, params=params,
            run_name=names.drill_run_name(job.name, checkpoint_step))
        runs.log_metrics(self.client, run_id, dict(metrics or {}), step=checkpoint_step)
        tags = {names.TAG_DRILL_PASSED: str(passed).lower()}
        if failure_reason:
            tags[names.TAG_FAILURE] = mask_url_credentials(failure_reason)[:5000]
        runs.set_tags(self.client, run_id, tags)
        self.client.set_terminated(run_id, status="FINISHED" if passed else "FAILED")
        return run_id

    def checkpoint_runs(self, job_name: str, *, kind: str) -> list[Run]:
        """The job's evaluation or drill runs, oldest first."""
        if kind not in (names.KIND_EVALUATION, names.KIND_DRILL):
            raise ValueError(f"kind must be {names.KIND_EVALUATION!r} or {names.KIND_DRILL!r}")
        return runs.find_runs(self.client, self.experiment_id,
                              {names.TAG_KIND: kind, names.TAG_JOB: job_name})

    def _checkpoint_child(self, job: JobSpec, *, kind: str, checkpoint_step: int,
                          checkpoint_uri: str, dagster_run_id: str | None,
                          params: Mapping[str, Any] | None, run_name: str) -> str:
        parent = self.job_run(job)
        tags = {names.TAG_KIND: kind, names.TAG_JOB: job.name, names.TAG_TENANT: job.tenant,
                names.TAG_CHECKPOINT_STEP: str(checkpoint_step),
                names.TAG_CHECKPOINT_URI: checkpoint_uri}
        if dagster_run_id:
            tags[names.TAG_DAGSTER_RUN] = dagster_run_id
        run_id = runs.create_run(self.client, self.experiment_id, run_name=run_name,
                                 tags=tags, parent_run_id=parent)
        runs.log_params(self.client, run_id, flatten_params(
            {"checkpoint": {"step": checkpoint_step, "uri": checkpoint_uri}, **(params or {})}))
        return run_id

    # -- links ---------------------------------------------------------------------------

    def run_url(self, run_id: str, *, ui_url: str | None = None) -> str | None:
        """The run's page in the MLflow UI (the server's URL, or `ui_url` for a sqlite
        store served by `make mlflow-ui`); None when there is no UI to link to."""
        base = ui_url or (self.tracking_uri if self.tracking_uri.startswith("http") else None)
        if not base:
            return None
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"


def _status(status: str) -> str:
    allowed = ("FINISHED", "FAILED", "KILLED")
    if status not in allowed:
        raise ValueError(f"run status must be one of {', '.join(allowed)}, got {status!r}")
    return status


def _redacted_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """`document` without credential keys (the same rule as params), for JSON artifacts."""
    from fm_pipeline.tracking.params import is_secret_key

    def clean(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(v) for k, v in value.items() if not is_secret_key(str(k))}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return mask_url_credentials(value)
        return value

    return clean(document)
