"""LocalRunLauncher: Dagster's default run launcher (each run a process the code server
starts on this machine) that also reports whether a run's worker is alive, so run
monitoring fails a run whose worker died (kill -9, the OOM killer) instead of leaving it
STARTED forever; the failure sensor then resumes the job.

    run_launcher:
      module: fm_pipeline.resources.run_launcher
      class: LocalRunLauncher

The worker's pid comes from the engine event the run worker logs as it starts ("Started
process for run (pid: N)"); its host from the tag this launcher adds at launch. A worker on
another host (or before it logged its pid) is UNKNOWN, which run monitoring leaves alone.
"""

from __future__ import annotations

import os
import socket

from dagster import DagsterEventType, DagsterRun
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, WorkerStatus

HOST_TAG = "fm/run_worker_host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by the code server) is not a live worker.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class LocalRunLauncher(DefaultRunLauncher):
    def launch_run(self, context: LaunchRunContext) -> None:
        self._instance.add_run_tags(context.dagster_run.run_id, {HOST_TAG: socket.gethostname()})
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        host = run.tags.get(HOST_TAG)
        if host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"worker on host {host!r}")
        records = self._instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)
        pid = None
        for record in records:
            message = record.message or ""
            if message.startswith("Started process for run (pid: "):
                pid = int(message.split("pid: ", 1)[1].split(")", 1)[0])
            elif message.startswith("Process for run exited"):
                return CheckRunHealthResult(WorkerStatus.SUCCESS, "the worker exited")
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "the worker logged no pid yet")
        if _alive(pid):
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"pid {pid}",
                                        run_worker_id=str(pid))
        return CheckRunHealthResult(WorkerStatus.FAILED,
                                    f"the run worker (pid {pid} on {host}) is gone",
                                    run_worker_id=str(pid))
