"""The REST API's orchestrator on Dagster: each API run is a chain of `training_segment_job`
runs on the Dagster instance (DAGSTER_HOME, the one `make ui` shows), and everything the
API says about runs is read back from Dagster's run records (api_runs.py).

    orch = DagsterOrchestrator()                    # DagsterInstance.get(), fm_pipeline defs
    plane = ControlPlane(tenants=..., orchestrator=orch, store=JobStore())

submit / resume register the job (spec + partition) and start a worker thread that runs
the first segment in process through PipelineDriver, then does what the daemon would: the
real sensors decide the next segment, a resume after a failure (within the retry budget)
or nothing; their requests run in the same worker until the job reaches its target step
or stops. Every segment run carries fm/api_job_id, fm/api_run (1, 2, ... per admission),
fm/tenant, fm/priority, fm/trigger and, when it starts from a checkpoint, fm/resume_from.

preempt / cancel tag the API run's segment run fm/stop=preempt|cancel (the sensors then
leave the job to the control plane) and ask the launcher resource to stop the job's running
segments (`stop_segments`: a local launch's preemption flag, a Kubernetes launch's JobSet
deleted gracefully, so its pods get the preStop flag and SIGTERM): the trainer checkpoints
at the next step boundary and exits 75. A cancelled run is then marked canceled in Dagster.
In the UI, filter Runs by `fm/api_job_id=<job id>`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

from dagster import AssetRecordsFilter, DagsterInstance, RunRequest
from fm_pipeline.assets.training.api_runs import api_job_names, api_run_records, run_infos
from fm_pipeline.assets.training.checkpoints import CHECKPOINT
from fm_pipeline.assets.training.driver import EVALUATION_SENSOR, PipelineDriver
from fm_pipeline.assets.training.names import (
    SEGMENT_JOB,
    TAG_API_JOB,
    TAG_API_RUN,
    TAG_RESUME_FROM,
    TAG_STOP,
    short,
)
from fm_pipeline.assets.training.requests import API_RESUME, SUBMIT, segment_request
from fm_pipeline.resources.launcher import launcher_from_env
from fm_pipeline.resources.launcher_local import LocalLauncher

from fm_pipeline.api.orchestrator import RunInfo, ThreadedRuns
from fm_pipeline.config import JobSpec
from fm_pipeline.config.paths import store_uri
from fm_pipeline.orchestration import next_segment
from fm_pipeline.orchestration.segments import checkpoint_step, newest_valid_step
from fm_pipeline.storage import open_store

log = logging.getLogger(__name__)
# Asked again until the run ends: a segment may still be starting (the trainer ignores a
# flag older than itself; a JobSet not yet submitted cannot be deleted).
STOP_EVERY_S = 1.0


@dataclass
class _ApiRun:
    """A run this process drives: its worker thread, and a stop the control plane asked."""

    job: JobSpec
    number: int
    first_run_id: str
    request: RunRequest
    started_at: float
    stop: str | None = None  # "preempt" or "cancel"
    segment_run_id: str | None = None  # the segment run executing, or the last one
    thread: threading.Thread | None = None
    error: str | None = None  # the worker itself broke
    ran: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class DagsterOrchestrator(ThreadedRuns):
    supports_resume_from = True

    def __init__(self, instance: DagsterInstance | None = None, *, resources: dict | None = None,
                 definitions=None, evaluate_checkpoints: bool = True,
                 join_timeout_s: float = 120.0):
        self.instance = instance or DagsterInstance.get()
        self.resources = dict(resources or {})  # overrides of the definitions' resources
        self.definitions = definitions
        self.evaluate_checkpoints = evaluate_checkpoints
        self.join_timeout_s = join_timeout_s
        self._lock = threading.Lock()
        self._active: dict[str, _ApiRun] = {}

    @classmethod
    def for_project(cls, **kwargs) -> DagsterOrchestrator:
        """On the project's instance: DAGSTER_HOME (default <FM_HOME>/dagster, as `make ui`
        and `fm demo` use), created with telemetry off if it is new; torchrun's output of a
        local launch goes to the segment's torchrun.log only."""
        import os

        from fm_pipeline.config.paths import dagster_home

        home = dagster_home()
        home.mkdir(parents=True, exist_ok=True)
        os.environ["DAGSTER_HOME"] = str(home)
        config = home / "dagster.yaml"
        if not config.is_file():
            config.write_text("telemetry:\n  enabled: false\n")
        launcher = launcher_from_env()
        if isinstance(launcher, LocalLauncher):
            launcher = LocalLauncher(echo_output=False)
        resources = {"launcher": launcher, **kwargs.pop("resources", {})}
        return cls(DagsterInstance.get(), resources=resources, **kwargs)

    def recover_orphans(self) -> list[str]:
        """Segment runs an earlier API process drove and left unfinished (it died): their
        trainers, which may outlive it, are asked to checkpoint and stop (the preemption
        flag), and the Dagster runs are marked failed with the reason, so the UI agrees with
        the API ("failed: ... resume it"). Call once, before serving. Returns the run ids."""
        from dagster import DagsterRunStatus, RunsFilter
        from fm_pipeline.assets.training.api_runs import LOST

        names = api_job_names(self.instance)
        if not names:
            return []
        unfinished = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED,
                      DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
                      DagsterRunStatus.CANCELING]
        records = self.instance.get_run_records(filters=RunsFilter(
            job_name=SEGMENT_JOB, statuses=unfinished, tags={TAG_API_JOB: names}))
        for record in records:
            run = record.dagster_run
            job_name = run.tags[TAG_API_JOB]
            try:
                self._launcher().stop_segments(job_name, reason="orphaned")
            except Exception as e:  # e.g. the cluster is unreachable: still mark the run
                log.warning("job %s: could not stop its segments: %s", job_name, e)
            self.instance.report_run_failed(run, message=LOST)
            log.warning("job %s: Dagster run %s was left %s by a control plane that stopped; "
                        "marked failed, its trainer asked to checkpoint and stop", job_name,
                        run.run_id, run.status.value)
        return [r.dagster_run.run_id for r in records]

    # -- Orchestrator ------------------------------------------------------------------

    def submit(self, job: JobSpec) -> str:
        return self._start(job, checkpoint=None)

    def resume(self, job: JobSpec, *, checkpoint: str | None = None) -> str:
        return self._start(job, checkpoint=checkpoint)

    def status(self, job_name: str) -> list[RunInfo]:
        with self._lock:
            active = self._active.get(job_name)
        target = active.job.training.steps if active else self._target_step(job_name)
        if target is None:
            return []

        def is_live(number: int) -> bool:
            return active is not None and active.number == number and active.live

        runs = run_infos(self.instance, job_name, target_step=target, is_live=is_live)
        if active is None:
            return runs
        if active.first_run_id not in {r.run_id for r in runs}:
            if active.live:  # launched; its Dagster run is being created
                runs.append(RunInfo(run_id=active.first_run_id, state="starting",
                                    started_at=active.started_at,
                                    resumed_from=active.request.tags.get(TAG_RESUME_FROM)))
            elif active.error:  # the worker broke before Dagster had a run
                runs.append(RunInfo(run_id=active.first_run_id, state="failed",
                                    started_at=active.started_at, ended_at=active.started_at,
                                    reason=active.error))
        elif active.error and runs[-1].run_id == active.first_run_id and \
                runs[-1].state == "failed" and not active.live:
            runs[-1] = replace(runs[-1], reason=active.error)
        return runs

    def preempt(self, job_name: str) -> None:
        self._stop(job_name, "preempt")

    def cancel(self, job_name: str) -> None:
        self._stop(job_name, "cancel")

    def list(self) -> list[str]:
        return api_job_names(self.instance)

    # -- starting ----------------------------------------------------------------------

    def _start(self, job: JobSpec, *, checkpoint: str | None) -> str:
        from fm_pipeline.assets.training.submit import register_training_job

        with self._lock:
            current = self._active.get(job.name)
            if current is not None and current.live:
                # A stopped run's worker may still be recording the sensors' decision.
                if current.stop is None:
                    raise ValueError(f"job {job.name} already has an active run "
                                     f"{current.first_run_id}")
                current.thread.join(self.join_timeout_s)
                if current.live:
                    raise ValueError(f"job {job.name}: the stopped run {current.first_run_id}"
                                     " has not finished yet")
            store = open_store(store_uri())
            register_training_job(self.instance, job, store=store)
            number = max(api_run_records(self.instance, job.name), default=0) + 1
            request = self._first_request(job, store, number=number, checkpoint=checkpoint)
            active = _ApiRun(job=job, number=number, first_run_id=str(uuid.uuid4()),
                             request=request, started_at=time.time())
            self._active[job.name] = active
            active.thread = threading.Thread(target=self._drive, args=(active,), daemon=True,
                                             name=f"api-run-{job.name}-{number}")
            active.thread.start()
        log.info("job %s: API run %d is Dagster run %s", job.name, number, active.first_run_id)
        return active.first_run_id

    def _first_request(self, job: JobSpec, store, *, number: int,
                       checkpoint: str | None) -> RunRequest:
        tags = {TAG_API_JOB: job.name, TAG_API_RUN: str(number)}
        if checkpoint:
            start, location = checkpoint_step(job, store, checkpoint), checkpoint
        else:
            start, location = newest_valid_step(job, store)
        following = next_segment(job, reached_step=start)
        if following is None:
            raise ValueError(f"job {job.name} already reached its target step "
                             f"{job.training.steps}")
        if location:
            tags[TAG_RESUME_FROM] = short(location)
        return segment_request(job, start_step=following[0], end_step=following[1],
                               trigger=API_RESUME if number > 1 else SUBMIT, tags=tags,
                               resume_from=checkpoint or "")

    # -- the worker: one per API run -----------------------------------------------------

    def _drive(self, active: _ApiRun) -> None:
        name = active.job.name
        driver = PipelineDriver(self.instance, resources=self.resources,
                                definitions=self.definitions)
        driver.cursors[EVALUATION_SENSOR] = self._newest_checkpoint_record()
        due = [(SEGMENT_JOB, "submit", active.request)]
        run_id: str | None = active.first_run_id
        try:
            while due:
                for job_name, origin, request in due:
                    if active.stop and job_name == SEGMENT_JOB:
                        continue
                    self._execute(driver, active, job_name, request, origin=origin,
                                  run_id=run_id)
                    run_id = None
                due = self._next(driver, active)
        except Exception as e:  # the worker broke: the run ends failed with the reason
            active.error = f"the Dagster driver failed: {e}"
            log.exception("job %s: API run %d", name, active.number)

    def _execute(self, driver: PipelineDriver, active: _ApiRun, job_name: str,
                 request: RunRequest, *, origin: str, run_id: str | None) -> None:
        run_id = run_id or str(uuid.uuid4())
        if job_name == SEGMENT_JOB:
            active.segment_run_id = run_id
        done = driver.execute(job_name, request, origin=origin, run_id=run_id)
        active.ran.append(done.run_id)
        if job_name != SEGMENT_JOB or not active.stop:
            return
        # A stop asked before the run record existed could not tag it then.
        self.instance.add_run_tags(run_id, {TAG_STOP: active.stop})
        if active.stop == "cancel" and not done.success:
            run = self.instance.get_run_by_id(run_id)
            self.instance.report_run_canceled(run, message="cancelled by the control plane")

    def _next(self, driver: PipelineDriver, active: _ApiRun) -> list:
        """What the sensors request next for this job (waiting out a resume's backoff)."""
        name = active.job.name
        while True:
            due = driver.tick_job(name, evaluate=self.evaluate_checkpoints and not active.stop)
            if due or active.stop:
                return due
            wait = driver.pending_resume_s(only=name)
            if wait is None:
                return []
            time.sleep(min(wait + 0.05, 1.0))

    def _newest_checkpoint_record(self) -> str | None:
        records = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=CHECKPOINT), limit=1, ascending=False).records
        return str(records[0].storage_id) if records else None

    # -- stopping ----------------------------------------------------------------------

    def _stop(self, job_name: str, how: str) -> None:
        with self._lock:
            active = self._active.get(job_name)
            if active is None or not active.live or active.stop:
                return
            active.stop = how
        self._tag_stop(active)
        threading.Thread(target=self._keep_stopping, args=(active,), daemon=True,
                         name=f"stop-{job_name}").start()

    def _tag_stop(self, active: _ApiRun) -> None:
        """Tag the segment run at once, so a daemon's failure sensor sees it too."""
        if active.segment_run_id and self.instance.get_run_by_id(active.segment_run_id):
            self.instance.add_run_tags(active.segment_run_id, {TAG_STOP: active.stop})

    def _keep_stopping(self, active: _ApiRun) -> None:
        """Stop the run's segments through the launcher, whichever it is, until it ends."""
        launcher = self._launcher()
        while active.live:
            try:
                stopped = launcher.stop_segments(active.job.name, reason=active.stop)
            except Exception as e:  # e.g. the API server did not answer: try again
                log.warning("job %s: stopping its segment failed: %s", active.job.name, e)
            else:
                if stopped and not isinstance(launcher, LocalLauncher):
                    log.info("job %s: %s asked to stop (%s)", active.job.name,
                             ", ".join(stopped), active.stop)
            time.sleep(STOP_EVERY_S)

    def _launcher(self):
        """The launcher resource the segments run with (stop_segments on both kinds)."""
        if "launcher" in self.resources:
            return self.resources["launcher"]
        return launcher_from_env()

    def _target_step(self, job_name: str) -> int | None:
        from fm_pipeline.orchestration import registered_job

        if not api_run_records(self.instance, job_name):
            return None
        return registered_job(open_store(store_uri()), job_name).training.steps

