"""The training pipeline in one process, decided by the real sensors and schedule.

    driver = PipelineDriver(instance, resources={"launcher": LocalLauncher(echo_output=False)})
    driver.execute(SEGMENT_JOB, first_segment_request(job, store=store), origin="submit")
    driver.run_until_idle()      # failure/progress/evaluation sensors until nothing is left
    driver.drill()               # the restore drill schedule, once

What the Dagster daemon does in a deployment, done here step by step: after each run the
sensors are evaluated (build_sensor_context / build_run_status_sensor_context, the same
functions the daemon calls) and the run requests they return are executed in process
(execute_in_process) with the daemon's run-key and sensor-name tags, so a daemon started
later (`make ui`) does not repeat them. A resume waiting out its backoff is waited for.
`fm demo` and the end-to-end tests use this.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    RunsFilter,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
    partition_loading_context,
)
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG
from fm_pipeline.assets.training.history import segment_run_records
from fm_pipeline.assets.training.names import (
    DRILL_JOB,
    EVALUATION_JOB,
    JOBS_PARTITION,
    RESUME_PENDING,
    SEGMENT_JOB,
    TAG_DECISION,
    TAG_END,
    TAG_RESUME_AT,
    TAG_START,
)

FAILURE_SENSOR = "segment_failure_sensor"
PROGRESS_SENSOR = "segment_progress_sensor"
EVALUATION_SENSOR = "checkpoint_evaluation_sensor"
DRILL_SCHEDULE = "restore_drill_schedule"


@dataclass
class ExecutedRun:
    job_name: str
    run_id: str
    origin: str  # "submit", or the sensor / schedule that requested it
    request: RunRequest
    success: bool
    seconds: float


@dataclass
class PipelineDriver:
    instance: DagsterInstance
    resources: dict = field(default_factory=dict)  # overrides of the definitions' resources
    definitions: object = None  # default: fm_pipeline.definitions.defs
    # Called as on_progress(job_name, request, run_id, done) every ~0.5 s while a run
    # executes (done None), then once with its ExecutedRun: progress displays hook in here.
    on_progress: Callable | None = None
    # Chaos for demos and drills: job name -> "RANK:STEP". The first segment of that job
    # whose range contains STEP runs with the fault (FM_FAULT_FAIL_AT); then it is spent.
    faults: dict[str, str] = field(default_factory=dict)
    max_runs: int = 100
    log_level: str = "WARNING"  # Dagster's console log of each run
    runs: list[ExecutedRun] = field(default_factory=list)
    cursors: dict[str, str | None] = field(default_factory=dict)
    _seen_failures: set[str] = field(default_factory=set)

    def __post_init__(self):
        if self.definitions is None:
            from fm_pipeline.definitions import defs

            self.definitions = defs
        self._all_resources = {**(self.definitions.resources or {}), **self.resources}

    # -- runs ----------------------------------------------------------------------------

    def execute(self, job_name: str, request: RunRequest, *, origin: str,
                run_id: str | None = None) -> ExecutedRun:
        """Run one request in process (in a worker thread while progress is reported);
        `run_id`: the Dagster run id to use (a caller that must name the run beforehand)."""
        if len(self.runs) >= self.max_runs:
            raise RuntimeError(f"more than {self.max_runs} runs: a sensor keeps requesting")
        request = self._with_fault(job_name, request)
        tags = dict(request.tags)
        if request.run_key and origin != "submit":
            tags.update({RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: origin})
        job_def = self.definitions.resolve_job_def(job_name)
        run_id = run_id or str(uuid.uuid4())
        box: dict = {}

        def target() -> None:
            try:
                box["result"] = job_def.execute_in_process(
                    instance=self.instance, run_id=run_id, partition_key=request.partition_key,
                    run_config={**request.run_config, "loggers": {
                        "console": {"config": {"log_level": self.log_level}}}},
                    tags=tags, raise_on_error=False,
                    resources={k: v for k, v in self.resources.items()})
            except BaseException as e:  # surfaced in the caller's thread
                box["error"] = e

        t0 = time.monotonic()
        worker = threading.Thread(target=target, name=f"run-{run_id[:8]}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(timeout=0.5)
            if self.on_progress is not None:
                self.on_progress(job_name, request, run_id, None)
        if "error" in box:
            raise box["error"]
        done = ExecutedRun(job_name=job_name, run_id=run_id, origin=origin, request=request,
                           success=box["result"].success, seconds=time.monotonic() - t0)
        self.runs.append(done)
        if self.on_progress is not None:
            self.on_progress(job_name, request, run_id, done)
        return done

    def _with_fault(self, job_name: str, request: RunRequest) -> RunRequest:
        fault = self.faults.get(request.partition_key or "")
        if job_name != SEGMENT_JOB or not fault:
            return request
        step = int(fault.partition(":")[2])
        if not int(request.tags[TAG_START]) <= step < int(request.tags[TAG_END]):
            return request
        del self.faults[request.partition_key]
        ops = dict(request.run_config.get("ops", {}))
        segment = ops.get("training_segment", {})
        ops["training_segment"] = {"config": {**segment.get("config", {}), "fail_at": fault}}
        return request.with_replaced_attrs(run_config={**request.run_config, "ops": ops})

    # -- sensors and the schedule ----------------------------------------------------------

    def _sensor(self, name: str) -> list[RunRequest]:
        sensor_def = self.definitions.resolve_sensor_def(name)
        context = build_sensor_context(instance=self.instance, cursor=self.cursors.get(name),
                                       resources=self._all_resources,
                                       definitions=self.definitions, sensor_name=name)
        # The daemon resolves requests (partition keys included) against the instance too.
        with partition_loading_context(dynamic_partitions_store=self.instance):
            data = sensor_def.evaluate_tick(context)
        if data.cursor is not None:
            self.cursors[name] = data.cursor
        return list(data.run_requests or [])

    def _failure_sensor(self, only: str | None = None) -> list[RunRequest]:
        """The run-failure sensor on every failed segment run it has not seen yet (`only`: of
        that job, among the runs this driver executed)."""
        sensor_def = self.definitions.resolve_sensor_def(FAILURE_SENSOR)
        mine = {r.run_id for r in self.runs}
        requests = []
        names = [only] if only else self.instance.get_dynamic_partitions(JOBS_PARTITION)
        for name in names:
            for record in segment_run_records(self.instance, name, limit=20):
                run = record.dagster_run
                if run.status != DagsterRunStatus.FAILURE or run.run_id in self._seen_failures:
                    continue
                if only and run.run_id not in mine:
                    continue
                self._seen_failures.add(run.run_id)
                logs = self.instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_FAILURE)
                if not logs:
                    continue
                context = build_run_status_sensor_context(
                    sensor_name=FAILURE_SENSOR, dagster_event=logs[-1].dagster_event,
                    dagster_instance=self.instance, dagster_run=run,
                    resources=self._all_resources).for_run_failure()
                result = sensor_def(context)
                if isinstance(result, RunRequest):
                    requests.append(result)
        return requests

    def pending_resume_s(self, only: str | None = None) -> float | None:
        """Seconds until the earliest resume waiting out its backoff (`only`: of that job);
        None if there is none."""
        waits = []
        for name in [only] if only else self.instance.get_dynamic_partitions(JOBS_PARTITION):
            records = segment_run_records(self.instance, name, limit=1)
            if records and records[0].dagster_run.tags.get(TAG_DECISION) == RESUME_PENDING:
                at = float(records[0].dagster_run.tags.get(TAG_RESUME_AT, "0"))
                waits.append(max(0.0, at - time.time()))
        return min(waits) if waits else None

    def tick(self) -> list[tuple[str, str, RunRequest]]:
        """One round of every sensor: (job, origin, request) to run, evaluations first."""
        due = [(SEGMENT_JOB, FAILURE_SENSOR, r) for r in self._failure_sensor()]
        due += [(EVALUATION_JOB, EVALUATION_SENSOR, r) for r in self._sensor(EVALUATION_SENSOR)]
        due += [(SEGMENT_JOB, PROGRESS_SENSOR, r) for r in self._sensor(PROGRESS_SENSOR)]
        return due

    def tick_job(self, name: str, *, evaluate: bool = True) -> list[tuple[str, str, RunRequest]]:
        """One round of the sensors for one training job, as `tick` does for all: failures of
        the runs this driver executed, then its evaluations and next segment. The REST API
        drives each of its jobs this way, one driver per API run."""
        due = [(SEGMENT_JOB, FAILURE_SENSOR, r) for r in self._failure_sensor(only=name)]
        if evaluate:
            due += [(EVALUATION_JOB, EVALUATION_SENSOR, r)
                    for r in self._sensor(EVALUATION_SENSOR) if r.partition_key == name]
        due += [(SEGMENT_JOB, PROGRESS_SENSOR, r)
                for r in self._sensor(PROGRESS_SENSOR) if r.partition_key == name]
        return [(j, origin, r) for j, origin, r in due if not self.already_ran(r, origin=origin)]

    def already_ran(self, request: RunRequest, *, origin: str) -> bool:
        if not request.run_key:
            return False
        return bool(self.instance.get_runs(filters=RunsFilter(
            tags={RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: origin}), limit=1))

    def run_until_idle(self) -> list[ExecutedRun]:
        """Tick the sensors and execute what they request until nothing is left to do."""
        executed = []
        while True:
            due = [(job_name, origin, request) for job_name, origin, request in self.tick()
                   if not self.already_ran(request, origin=origin)]  # as the daemon skips them
            if not due:
                wait = self.pending_resume_s()
                if wait is None:
                    return executed
                time.sleep(wait + 0.05)
                continue
            for job_name, origin, request in due:
                executed.append(self.execute(job_name, request, origin=origin))

    def drill(self) -> list[ExecutedRun]:
        """Evaluate the restore drill schedule once and execute what it requests."""
        schedule = self.definitions.resolve_schedule_def(DRILL_SCHEDULE)
        context = build_schedule_context(
            instance=self.instance, resources=self._all_resources,
            repository_def=self.definitions.get_repository_def())
        with partition_loading_context(dynamic_partitions_store=self.instance):
            data = schedule.evaluate_tick(context)
        return [self.execute(DRILL_JOB, r, origin=DRILL_SCHEDULE)
                for r in (data.run_requests or [])]
