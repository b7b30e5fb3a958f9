"""MLflow as a Dagster resource: a thin wrapper around fm_pipeline.tracking.JobTracker
(an `MlflowClient(tracking_uri)`, never mlflow's global state, so several jobs and
processes can share it).

    resources={"mlflow": MlflowTrackingResource()}      # sqlite under FM_HOME by default
    MlflowTrackingResource(tracking_uri="http://mlflow:5000", experiment="pretraining")

    @asset
    def segment(context, mlflow: MlflowTrackingResource, launcher: LocalLauncher):
        job = ...
        run_id = mlflow.start_segment_run(job, segment=f"to-{end}", end_step=end,
                                          dagster_run_id=context.run_id)
        env = mlflow.trainer_env(run_id)     # pass to the launcher: rank 0 logs every step
        try:
            result = launcher.launch_segment(..., env=env)
        except Failure as e:
            mlflow.finish_segment(run_id, outcome=..., failure_reason=str(e)); raise
        mlflow.finish_segment(run_id, outcome="succeeded", summary=rank0_summary)

Methods (all idempotent by tags; see fm_pipeline/tracking/tracker.py and docs/tracking.md):
job_run(job) -> parent run id; log_plan(job, plan); start_segment_run(job, *, segment,
end_step, dagster_run_id, start_step=None) -> run id; trainer_env(run_id) -> env vars;
finish_segment(run_id, *, outcome, summary=None, failure_reason=None);
log_evaluation(job, *, checkpoint_step, checkpoint_uri, metrics, dagster_run_id) -> run id;
log_drill(job, *, checkpoint_step, checkpoint_uri, passed, metrics, params, dagster_run_id,
failure_reason) -> run id; finish_job(job, *, status="FINISHED"); run_url(run_id).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field

from fm_pipeline.config import JobSpec
from fm_pipeline.config.site import Site
from fm_pipeline.tracking import JobTracker
from fm_pipeline.tracking.names import DEFAULT_EXPERIMENT, ENV_UI_URL


class MlflowTrackingResource(ConfigurableResource):
    tracking_uri: str = Field(
        default="", description="http://host:port or sqlite:///path; empty: FM_MLFLOW_URI, "
                                "else sqlite:///<FM_HOME>/mlflow.db")
    experiment: str = Field(default=DEFAULT_EXPERIMENT, description="MLflow experiment name")
    ui_url: str = Field(
        default="", description="MLflow UI to link runs to; empty: FM_MLFLOW_UI_URL (set by "
                                "`make ui`), else the tracking URI when it is http")

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Open the store on a thread as the run starts: mlflow's import and a sqlite
        store's first open cost ~4 s on 2 cores, which the step's own work before its first
        MLflow call (the plan, the segment's checkpoint choice) now hides."""
        _warm(self._uri())

    def _uri(self) -> str:
        # Resolved per call: FM_HOME is read when the run executes, not when code loads.
        return self.tracking_uri or Site.from_environ().tracking_uri

    def tracker(self) -> JobTracker:
        uri = self._uri()
        if (warming := _WARMING.get(uri)) is not None:
            warming.join()  # (a failure there is met again, and reported, by the call)
        return JobTracker(uri, experiment=self.experiment)

    def job_run(self, job: JobSpec) -> str:
        return self.tracker().job_run(job)

    def log_plan(self, job: JobSpec, plan: Mapping[str, Any]) -> None:
        self.tracker().log_plan(job, plan)

    def start_segment_run(self, job: JobSpec, *, segment: str, end_step: int,
                          dagster_run_id: str | None = None,
                          start_step: int | None = None) -> str:
        return self.tracker().start_segment_run(job, segment=segment, end_step=end_step,
                                                dagster_run_id=dagster_run_id,
                                                start_step=start_step)

    def trainer_env(self, run_id: str) -> dict[str, str]:
        return self.tracker().trainer_env(run_id)

    def note_exclusion(self, run_id: str, note: str) -> None:
        """The straggler exclusion a segment's launch applied, as a tag of its run."""
        from fm_pipeline.tracking import names

        self.tracker().client.set_tag(run_id, names.TAG_EXCLUSION, note)

    def finish_segment(self, run_id: str, *, outcome: str,
                       summary: Mapping[str, Any] | None = None,
                       failure_reason: str | None = None) -> None:
        self.tracker().finish_segment(run_id, outcome=outcome, summary=summary,
                                      failure_reason=failure_reason)

    def log_evaluation(self, job: JobSpec, *, checkpoint_step: int, checkpoint_uri: str,
                       metrics: Mapping[str, float], dagster_run_id: str | None = None,
                       params: Mapping[str, Any] | None = None) -> str:
        return self.tracker().log_evaluation(
            job, checkpoint_step=checkpoint_step, checkpoint_uri=checkpoint_uri,
            metrics=metrics, dagster_run_id=dagster_run_id, params=params)

    def log_drill(self, job: JobSpec, *, checkpoint_step: int, checkpoint_uri: str,
                  passed: bool, metrics: Mapping[str, float] | None = None,
                  params: Mapping[str, Any] | None = None, dagster_run_id: str | None = None,
                  failure_reason: str | None = None) -> str:
        return self.tracker().log_drill(
            job, checkpoint_step=checkpoint_step, checkpoint_uri=checkpoint_uri, passed=passed,
            metrics=metrics, params=params, dagster_run_id=dagster_run_id,
            failure_reason=failure_reason)

    def finish_job(self, job: JobSpec, *, status: str = "FINISHED") -> None:
        self.tracker().finish_job(job, status=status)

    def run_url(self, run_id: str) -> str | None:
        """For Dagster metadata (MetadataValue.url); None when there is no UI to link."""
        ui_url = self.ui_url or os.environ.get(ENV_UI_URL) or None
        return self.tracker().run_url(run_id, ui_url=ui_url)


_WARMING: dict[str, threading.Thread] = {}


def _warm(uri: str) -> None:
    """Import mlflow once per process on a daemon thread and, for a sqlite store, open it
    (mlflow keeps the store per URI: every later client of it is ready at once). A server
    is not called: one that is down must fail the step's own call, not hang here."""
    if uri in _WARMING:
        return

    def open_store() -> None:
        try:
            from fm_pipeline.tracking import runs

            if uri.startswith("sqlite:///"):
                runs.open_client(uri).search_experiments(max_results=1)
            else:
                importlib.import_module("mlflow.tracking")  # the import is the cost
        except Exception:  # noqa: BLE001 - the step's own first call meets it and says so
            pass

    _WARMING[uri] = threading.Thread(target=open_store, name="fm-mlflow-warm", daemon=True)
    _WARMING[uri].start()
