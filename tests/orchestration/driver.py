"""Segment runs executed in process (`execute_in_process(raise_on_error=False)`, the
LAUNCHER TEST DOUBLE: real checkpoints, no torchrun) and the sensors' ticks against one
Dagster instance, as the daemon would drive them."""

from __future__ import annotations

from dagster import (
    RunRequest,
    SensorResult,
    build_run_status_sensor_context,
    build_sensor_context,
    partition_loading_context,
)
from fm_pipeline.assets.training.intake import run_intake_sensor
from fm_pipeline.assets.training.sensors import segment_failure_sensor, segment_progress_sensor
from fm_pipeline.dagster_runs.names import SEGMENT_JOB
from fm_pipeline.dagster_runs.submit import register_training_job
from fm_pipeline.resources.mlflow import MlflowTrackingResource
from fm_pipeline.resources.store import ObjectStoreResource
from fm_pipeline.resources.training_policy import TrainingPolicyResource

from fm_pipeline.definitions import defs
from tests.orchestration.launcher_double import PREEMPT_ENV, LauncherDouble


class Sensors:
    """Segment runs in process and sensor ticks against one instance."""

    def __init__(self, instance, *, policy: TrainingPolicyResource):
        self.instance = instance
        self.store = ObjectStoreResource()
        self.resources = {"store": self.store, "training_policy": policy}

    def run(self, request: RunRequest, *, fault: str = "", preempt_at: int | None = None):
        config = dict(request.run_config["ops"]["training_segment"]["config"])
        if fault:
            config["fail_at"] = fault
        job_def = defs.resolve_job_def("training_segment_job")
        kwargs = {"partition_key": request.partition_key, "tags": dict(request.tags),
                  "run_config": {"ops": {"training_segment": {"config": config}}}}
        double = LauncherDouble()
        if preempt_at is not None:  # the double reads it from the env the asset passes on
            class Preempting(LauncherDouble):
                def launch_segment(self, context, *, env=None, **kw):
                    return super().launch_segment(context, env={**(env or {}),
                                                                PREEMPT_ENV: str(preempt_at)},
                                                  **kw)
            double = Preempting()
        return job_def.execute_in_process(
            instance=self.instance, raise_on_error=False, **kwargs,
            resources={"launcher": double, "mlflow": MlflowTrackingResource()})

    def on_failure(self, result):
        context = build_run_status_sensor_context(
            sensor_name="segment_failure_sensor", dagster_event=result.get_run_failure_event(),
            dagster_instance=self.instance, dagster_run=result.dagster_run,
            resources=self.resources).for_run_failure()
        return segment_failure_sensor(context)

    def progress(self):
        context = build_sensor_context(instance=self.instance, resources=self.resources,
                                       definitions=defs)
        with partition_loading_context(dynamic_partitions_store=self.instance):
            return segment_progress_sensor(context)

    def intake(self):
        """The intake sensor's tick: the first segment run of each submitted training run
        (a fresh cursor each time: the caller skips run keys it has run, as the daemon)."""
        context = build_sensor_context(instance=self.instance, resources=self.resources,
                                       definitions=defs)
        with partition_loading_context(dynamic_partitions_store=self.instance):
            return run_intake_sensor(context)

    def tags(self, result) -> dict:
        return self.instance.get_run_by_id(result.run_id).tags

    def until_idle(self) -> list[str]:
        """Run the segment runs the intake sensor asks for (a data mix run is left: the tests'
        mix is published), then each success's next segment and each
        failure's resume (the policy's), until nothing is asked; the run keys run, in order."""
        done: list[str] = []
        pending = [r for r in requests_of(self.intake()) if r.job_name == SEGMENT_JOB]
        while pending:
            request = pending.pop(0)
            if request.run_key in done:
                continue
            done.append(request.run_key)
            result = self.run(request)
            following = requests_of(self.progress()) if result.success else requests_of(
                self.on_failure(result))
            pending += [r for r in following if r.run_key not in done]
        return done


class Pipeline(Sensors):
    """One registered job's runs and ticks."""

    def __init__(self, instance, job, *, policy: TrainingPolicyResource):
        super().__init__(instance, policy=policy)
        self.job = job
        register_training_job(instance, job, store=self.store.open())


def requests_of(outcome) -> list[RunRequest]:
    if isinstance(outcome, RunRequest):
        return [outcome]
    if isinstance(outcome, SensorResult):
        return list(outcome.run_requests or [])
    return []
