"""The narrow interface the control plane drives: start, stop and observe a job's runs.

A run is one attempt at the job (one or more training segments until it reaches its
target step or stops). The control plane decides *when* (admission, preemption); the
orchestrator decides *how*, and is the only source of truth about runs.

Implementations: Dagster (a run of the training job per attempt, tags tenant/priority/
seq; the orchestration area provides it) and, on one machine, local torchrun segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from fm_pipeline.config import JobSpec

RunState = Literal["starting", "running", "succeeded", "failed", "preempted", "cancelled"]
ENDED: frozenset[str] = frozenset({"succeeded", "failed", "preempted", "cancelled"})


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    state: RunState
    started_at: float  # Unix seconds
    ended_at: float | None = None
    reason: str | None = None  # why it ended, in words (the root cause for a failure)
    resumed_from: str | None = None  # the checkpoint it started from, if any

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class Orchestrator(Protocol):
    def submit(self, job: JobSpec) -> str:
        """Start the job's first run (from scratch, or from its latest valid checkpoint)."""

    def resume(self, job: JobSpec, *, checkpoint: str | None = None) -> str:
        """Start a new run from `checkpoint` (None: the latest valid one)."""

    def status(self, job_name: str) -> list[RunInfo]:
        """Every run of the job, oldest first ([] if it never ran)."""

    def preempt(self, job_name: str) -> None:
        """SIGTERM the active run: it checkpoints and its run ends `preempted`."""

    def cancel(self, job_name: str) -> None:
        """Stop the active run for good: it ends `cancelled`."""

    def list(self) -> list[str]:
        """Names of the jobs this orchestrator has runs for."""


class ThreadedRuns:
    """What both orchestrators share: one worker thread per active run, in `_active` (job
    name -> an object with `.thread`) under `_lock`."""

    def wait(self, job_name: str, timeout: float | None = None) -> RunInfo:
        """Block until the job's active run ends (tests, scripts and the CLI use it)."""
        with self._lock:
            active = self._active.get(job_name)
        if active is not None and active.thread is not None:
            active.thread.join(timeout)
        return self.status(job_name)[-1]

