"""The REST API's orchestrator on Dagster: the API submits, the Dagster daemon runs.

    orch = DagsterOrchestrator.for_project(site)    # DagsterInstance.get() (DAGSTER_HOME)
    plane = ControlPlane(tenants=..., orchestrator=orch, store=JobStore())

submit / resume register the job (spec + partition), check that its first segment can run
(an unknown checkpoint or a job at its target is refused at once) and record a training
submission (orchestration.submissions); the daemon's intake sensor starts its first
segment run (run key `run-<job>-<n>`, which is also the API's run id), and the failure and
progress sensors carry it to its target step. This process starts no run: every API
process, the daemon and the webserver read the same records, so a second `fm api serve`
on the instance sees the first one's runs as they are, never as orphans.

preempt / cancel record the stop in the store first (no later segment of that run starts,
whoever would start it), tag the unfinished segment runs fm/stop and ask the instance's run
coordinator to cancel them: a queued run is canceled at once; a started one is terminated
by its run launcher, which interrupts the segment: the trainer checkpoints at the next step
boundary and exits 75, and the run ends canceled (preempted or cancelled in the API).
In the UI, filter Runs by `fm/api_job_id=<job id>`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from dagster import DagsterInstance, DagsterRunStatus
from fm_pipeline.dagster_runs.api_jobs import api_job_names, api_run_records, run_infos
from fm_pipeline.dagster_runs.names import TAG_API_JOB, TAG_STOP, short

from fm_pipeline.api.orchestrator import RunInfo
from fm_pipeline.config import JobSpec
from fm_pipeline.config.site import Site
from fm_pipeline.orchestration import registered_job
from fm_pipeline.orchestration.segments import plan_segment
from fm_pipeline.orchestration.submissions import (
    job_submissions,
    rejection,
    request_stop,
    stop_of,
    submit_run,
)

log = logging.getLogger(__name__)
_UNFINISHED = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED,
               DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)
WAIT_POLL_S = 0.5


class DagsterOrchestrator:
    def __init__(self, instance: DagsterInstance, *, site: Site, store=None):
        self.instance, self.site = instance, site
        self._store = store

    @classmethod
    def for_project(cls, site: Site) -> DagsterOrchestrator:
        """On the site's Dagster instance (DAGSTER_HOME: `fm api serve` writes it and keeps a
        daemon for it)."""
        return cls(DagsterInstance.get(), site=site)

    @property
    def store(self):
        if self._store is None:
            self._store = self.site.store()
        return self._store

    # -- Orchestrator ------------------------------------------------------------------

    def submit(self, job: JobSpec) -> str:
        return self._start(job, checkpoint=None)

    def resume(self, job: JobSpec, *, checkpoint: str | None = None) -> str:
        return self._start(job, checkpoint=checkpoint)

    def status(self, job_name: str) -> list[RunInfo]:
        wanted = [s for s in job_submissions(self.store, job_name) if s.kind == "train"]
        if not wanted:
            return []
        target = registered_job(self.store, job_name).training.steps
        stops = {s.number: stop.how for s in wanted
                 if (stop := stop_of(self.store, job_name, s.number))}
        ran = run_infos(self.instance, job_name, target_step=target, stops=stops)
        out = []
        for s in wanted:
            if s.number in ran:
                out.append(_renamed(ran[s.number], s.run_key))
            else:
                out.append(self._not_started(s, stops.get(s.number)))
        return out

    def preempt(self, job_name: str) -> None:
        self._stop(job_name, "preempt")

    def cancel(self, job_name: str) -> None:
        self._stop(job_name, "cancel")

    def list(self) -> list[str]:
        return api_job_names(self.instance)

    def wait(self, job_name: str, timeout: float | None = None) -> RunInfo:
        """Until the job's newest run ended (tests, scripts); its state either way."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            runs = self.status(job_name)
            if not runs or runs[-1].ended or (deadline and time.monotonic() > deadline):
                return runs[-1] if runs else None
            time.sleep(WAIT_POLL_S)

    # -- starting ----------------------------------------------------------------------

    def _start(self, job: JobSpec, *, checkpoint: str | None) -> str:
        from fm_pipeline.dagster_runs.submit import register_training_job

        runs = self.status(job.name) if job_submissions(self.store, job.name) else []
        if runs and not runs[-1].ended:
            raise ValueError(f"job {job.name} already has an active run {runs[-1].run_id}")
        register_training_job(self.instance, job, store=self.store)
        plan_segment(job, self.store, site=self.site,  # refused now, not later
                     resume_from=checkpoint or "")
        submission = submit_run(self.store, job, tags={TAG_API_JOB: job.name},
                                resume_from=checkpoint or "")
        log.info("job %s: training run %d submitted (%s)", job.name, submission.number,
                 submission.run_key)
        return submission.run_key

    def _not_started(self, submission, stop: str | None) -> RunInfo:
        """A submission the daemon has not turned into a run (yet, or ever)."""
        common = dict(run_id=submission.run_key, started_at=submission.at,
                      resumed_from=short(submission.resume_from) or None)
        reason = rejection(self.store, submission.job, submission.number)
        if reason:
            return RunInfo(state="failed", ended_at=submission.at, reason=reason, **common)
        if stop:
            state = "preempted" if stop == "preempt" else "cancelled"
            return RunInfo(state=state, ended_at=submission.at,
                           reason=f"{state} before its first segment started", **common)
        return RunInfo(state="starting", **common)

    # -- stopping ----------------------------------------------------------------------

    def _stop(self, job_name: str, how: str) -> None:
        runs = self.status(job_name)
        if not runs or runs[-1].ended:
            return
        number = int(runs[-1].run_id.rsplit("-", 1)[1])
        request_stop(self.store, job_name, number, how)
        for record in api_run_records(self.instance, job_name).get(number, []):
            run = record.dagster_run
            if run.status in _UNFINISHED:
                self.instance.add_run_tags(run.run_id, {TAG_STOP: how})
                self._cancel(run.run_id)
                log.info("job %s: run %s asked to stop (%s)", job_name, run.run_id, how)

    def _cancel(self, run_id: str, attempts: int = 3) -> None:
        """The run coordinator cancels a queued run, or has the launcher terminate it."""
        for attempt in range(attempts):
            try:
                self.instance.run_coordinator.cancel_run(run_id)
                return
            except Exception as e:  # the code server restarting: the stop marker holds
                log.warning("cancelling run %s failed (attempt %d): %s", run_id,
                            attempt + 1, e)
                time.sleep(1.0)


def _renamed(info: RunInfo, run_id: str) -> RunInfo:
    return replace(info, run_id=run_id)

