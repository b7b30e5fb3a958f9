"""A recording orchestrator for API tests: runs are records the test moves along by hand
(as Dagster would report them), so each test decides when a run starts, stops or fails."""

from __future__ import annotations

import itertools
from dataclasses import replace

from fm_pipeline.api.orchestrator import RunInfo


class RecordingOrchestrator:
    def __init__(self, clock):
        self.clock = clock
        self.runs: dict[str, list[RunInfo]] = {}
        self.calls: list[tuple[str, str, str | None]] = []  # (verb, job, checkpoint)
        self._ids = itertools.count(1)

    def _start(self, job, checkpoint):
        run = RunInfo(run_id=f"run-{next(self._ids)}", state="running",
                      started_at=self.clock(), resumed_from=checkpoint)
        self.runs.setdefault(job.name, []).append(run)
        return run.run_id

    def submit(self, job):
        self.calls.append(("submit", job.name, None))
        return self._start(job, None)

    def resume(self, job, *, checkpoint=None):
        self.calls.append(("resume", job.name, checkpoint))
        return self._start(job, checkpoint)

    def status(self, job_name):
        return list(self.runs.get(job_name, []))

    def preempt(self, job_name):
        self.calls.append(("preempt", job_name, None))

    def cancel(self, job_name):
        self.calls.append(("cancel", job_name, None))

    def list(self):
        return sorted(self.runs)

    # -- what the test plays: a run's end, as the orchestrator would observe it
    def end(self, job_name: str, state: str, reason: str | None = None) -> None:
        runs = self.runs[job_name]
        runs[-1] = replace(runs[-1], state=state, ended_at=self.clock(), reason=reason)
