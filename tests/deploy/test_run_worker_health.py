"""LocalRunLauncher's worker health, which run monitoring acts on: a run whose worker
process is gone (kill -9, the OOM killer, with its code server gone too, so nobody else
marks it) is FAILED; a live one RUNNING; one not started yet or on another host UNKNOWN
(run monitoring leaves those alone); one whose worker exited normally SUCCESS."""

from __future__ import annotations

import socket
import time
import subprocess
import sys
import uuid

import pytest
from dagster import DagsterInstance, DagsterRun
from dagster._core.launcher.base import WorkerStatus
from fm_pipeline.resources.run_launcher import HOST_TAG, LocalRunLauncher


@pytest.fixture
def launcher():
    with DagsterInstance.ephemeral() as instance:
        launcher = LocalRunLauncher()
        launcher.register_instance(instance)
        yield instance, launcher


def run_with(instance, *, host: str | None = None, messages=()) -> DagsterRun:
    run = DagsterRun(job_name="training_segment_job", run_id=str(uuid.uuid4()),
                     tags={HOST_TAG: host or socket.gethostname()})
    instance.add_run(run)
    for message in messages:
        instance.report_engine_event(message, run)
    return run


def test_a_worker_that_is_gone_is_failed_and_a_live_one_running(launcher):
    instance, health = launcher
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = run_with(instance, messages=[f"Started process for run (pid: {worker.pid})."])
        result = health.check_run_worker_health(run)
        assert result.status == WorkerStatus.RUNNING and result.run_worker_id == str(worker.pid)
        worker.kill()
        worker.wait()
        result = health.check_run_worker_health(run)
        assert result.status == WorkerStatus.FAILED
        assert f"pid {worker.pid}" in result.msg and "is gone" in result.msg
    finally:
        worker.kill()


def test_a_zombie_worker_is_not_alive(launcher):
    instance, health = launcher
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    # Exited but not reaped (no wait() yet): /proc shows it as a zombie.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{worker.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    run = run_with(instance, messages=[f"Started process for run (pid: {worker.pid})."])
    assert health.check_run_worker_health(run).status == WorkerStatus.FAILED
    worker.wait()


def test_unknown_before_the_pid_and_on_another_host_success_once_exited(launcher):
    instance, health = launcher
    assert health.check_run_worker_health(run_with(instance)).status == WorkerStatus.UNKNOWN
    elsewhere = run_with(instance, host="another-node", messages=[
        "Started process for run (pid: 1)."])
    assert health.check_run_worker_health(elsewhere).status == WorkerStatus.UNKNOWN
    exited = run_with(instance, messages=["Started process for run (pid: 999999).",
                                          "Process for run exited (pid: 999999)."])
    assert health.check_run_worker_health(exited).status == WorkerStatus.SUCCESS
