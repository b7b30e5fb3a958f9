"""The REST API on the real Dagster deployment: the API process only submits and reads run
records, a real `dagster-daemon` starts every run (its intake, failure and progress sensors,
the run queue, the local run launcher), tiny real training jobs (debug model, one CPU rank,
torchrun). The seed's calls, an admin preemption that checkpoints first and resumes without
losing a step, a resume from a chosen older checkpoint, a cancel, a cancel before the first
segment started, and a run worker killed outright (run monitoring, then the failure sensor)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from dagster import DagsterRunStatus
from tests.local_site import runs_dir
from fm_pipeline.scheduling import parse_tenants
from tests.api.conftest import TENANTS, auth
from tests.deploy.stack import deployment, wait_for
from tests import local_site

pytestmark = [pytest.mark.slow, pytest.mark.server]
SLOW_STEP = "0:0.5"  # rank 0 sleeps 0.5 s per step: time to act while a run trains


def steps_by_launch(job_id: str) -> list[list[int]]:
    """The steps the trainer logged, per torchrun launch, in order."""
    launches: dict[str, list[int]] = {}
    path = runs_dir(job_id) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        if record.get("kind") == "step":
            launches.setdefault(record["segment"], []).append(record["step"])
    return list(launches.values())


def segment_runs(instance, job_id: str) -> list:
    from fm_pipeline.dagster_runs.api_jobs import api_run_records

    return [r for records in api_run_records(instance, job_id).values() for r in records]


@pytest.fixture
def stack(fm_home, mix_store, monkeypatch):
    monkeypatch.setenv("FM_STORE_URI", mix_store["root"])
    env = {"FM_STORE_URI": mix_store["root"], "FM_FAULT_SLOW_RANKS": SLOW_STEP,
           "FM_RETRY_BACKOFF_S": "1"}
    with deployment(fm_home, env=env) as s:
        yield s
        for record in s.instance.get_run_records():  # nothing keeps training after a test
            if record.dagster_run.status in (DagsterRunStatus.STARTED,
                                             DagsterRunStatus.QUEUED):
                s.instance.run_coordinator.cancel_run(record.dagster_run.run_id)


@pytest.fixture
def orch(stack):
    from fm_pipeline.dagster_runs.orchestrator import DagsterOrchestrator

    return DagsterOrchestrator(stack.instance, site=local_site.site())


@pytest.fixture
def api(stack, orch, mix_store, tokens):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane

    plane = ControlPlane(tenants=parse_tenants(TENANTS), orchestrator=orch, store=local_site.job_store(),
                         site=local_site.site().with_store(mix_store["root"]))
    with TestClient(create_app(plane, local_site.token_store(), tick_s=0.2)) as client:
        yield client
    plane.store.close()


def tiny_body(mix_store, steps: int) -> dict:
    return {"model": "debug", "gpus": 1, "parallelism": {"tp": 1, "pp": 1, "dp": 1},
            "checkpoint_every_steps": 2, "data_manifest": mix_store["manifest"],
            "priority": "high", "steps": steps}


def test_seed_calls_preemption_and_resume_from_a_checkpoint_through_the_daemon(
        api, stack, orch, tokens, mix_store):
    client, instance = api, stack.instance
    prod, admin = auth(tokens["prod"]), auth(tokens["admin"])

    def status() -> dict:
        return client.get(f"/v1/training/jobs/{job_id}", headers=prod).json()

    # 1. submit: the daemon's intake starts the first segment run with the API's tags.
    r = client.post("/v1/training/jobs", json=tiny_body(mix_store, steps=12), headers=prod)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    # 2. status: the run state from Dagster, the step from the trainer's metrics.
    wait_for("step 3", lambda: (status().get("step") or 0) >= 3)
    assert status()["status"] == "running"
    (first,) = segment_runs(instance, job_id)
    assert first.dagster_run.status == DagsterRunStatus.STARTED
    assert {k: first.dagster_run.tags[k] for k in (
        "fm/api_job_id", "fm/api_run", "fm/tenant", "fm/priority", "fm/trigger",
        "dagster/partition", "dagster/sensor_name", "dagster/run_key")} == {
        "fm/api_job_id": job_id, "fm/api_run": "1", "fm/tenant": "prod",
        "fm/priority": "high", "fm/trigger": "submit", "dagster/partition": job_id,
        "dagster/sensor_name": "run_intake_sensor", "dagster/run_key": f"run-{job_id}-1"}
    assert orch.status(job_id)[0].run_id == f"run-{job_id}-1"

    # Preempted by an admin: the run is terminated, its segment checkpoints first (exit 75),
    # the run ends canceled, the control plane requeues the job and it resumes from there.
    r = client.post(f"/v1/training/jobs/{job_id}/preempt", headers=admin)
    assert r.status_code == 202 and r.json()["status"] == "preempting"
    wait_for("the resumed run to train", lambda: len(steps_by_launch(job_id)) == 2
             and len(steps_by_launch(job_id)[1]) >= 2)
    before, after = steps_by_launch(job_id)
    stopped_at = before[-1]
    assert after[0] == stopped_at + 1  # no step lost, none repeated
    runs = orch.status(job_id)
    assert [r.state for r in runs] == ["preempted", "running"]
    assert "preempted by the control plane (preempted:" in runs[0].reason
    assert runs[1].resumed_from.endswith(f"step-{stopped_at:08d}")
    preempted = segment_runs(instance, job_id)[0].dagster_run
    assert preempted.status == DagsterRunStatus.CANCELED
    assert preempted.tags["fm/stop"] == "preempt"
    assert (preempted.tags["fm/outcome"], preempted.tags["fm/exit_code"]) == ("preempted", "75")

    # 3. resume from a chosen older checkpoint while running: stop, restart from there.
    committed = {c["step"] for c in client.get(f"/v1/training/jobs/{job_id}/checkpoints",
                                               headers=prod).json()["checkpoints"]
                 if c["committed"]}
    # The second newest: the job keeps training and retention keeps the newest few, so the
    # oldest listed may be gone by the time the request arrives (a 422 that names it).
    older = sorted(committed)[-2]
    assert older < max(committed)
    r = client.post(f"/v1/training/jobs/{job_id}/resume",
                    json={"checkpoint": f"step-{older:08d}"}, headers=prod)
    assert r.status_code == 202 and r.json()["status"] == "restarting", r.text
    wait_for("the job to finish", lambda: status()["status"] == "succeeded")
    final = status()
    assert final["step"] == 12 and final["last_ckpt_step"] == 12 and final["runs"] == 3
    launches = steps_by_launch(job_id)
    assert launches[2][0] == older + 1 and launches[2][-1] == 12  # restarted from `older`
    assert [r.state for r in orch.status(job_id)] == ["preempted", "preempted", "succeeded"]
    last = segment_runs(instance, job_id)[-1].dagster_run
    assert last.status == DagsterRunStatus.SUCCESS
    assert last.tags["fm/api_run"] == "3" and last.tags["fm/trigger"] == "api_resume"
    assert last.tags["fm/resume_from"].endswith(f"step-{older:08d}")
    # One segment run per API run: no sensor resumed a stopped run on its own.
    assert len(segment_runs(instance, job_id)) == 3


def small(name: str, steps: int = 40):
    from fm_pipeline.data.testing import small_job

    return small_job(**{"name": name, "training.steps": steps, "training.segment_steps": steps,
                        "tenant": "research"})


def test_cancel_ends_the_run_canceled_and_nothing_resumes_it(stack, orch):
    job = small("job-cancelled")
    orch.submit(job)
    wait_for("a step", lambda: steps_by_launch(job.name))
    assert orch.status(job.name)[-1].state == "running"
    orch.cancel(job.name)
    run = orch.wait(job.name, timeout=120)
    assert run.state == "cancelled" and "cancelled by the control plane" in run.reason
    (record,) = segment_runs(stack.instance, job.name)
    assert record.dagster_run.status == DagsterRunStatus.CANCELED
    assert record.dagster_run.tags["fm/stop"] == "cancel"
    assert record.dagster_run.tags["fm/exit_code"] == "75"  # it checkpointed first
    assert steps_by_launch(job.name)[0][-1] < 40
    time.sleep(12)  # two ticks of every sensor: none starts anything for it
    assert len(segment_runs(stack.instance, job.name)) == 1
    assert orch.list() == ["job-cancelled"]


def test_cancel_before_the_first_segment_starts_withdraws_the_submission(stack, orch):
    job = small("job-withdrawn")
    run_id = orch.submit(job)
    orch.cancel(job.name)  # the daemon's next intake tick comes later
    run = orch.wait(job.name, timeout=60)
    assert run.run_id == run_id and run.state == "cancelled"
    time.sleep(8)  # the intake has looked at it since
    assert orch.status(job.name)[-1].state == "cancelled"
    assert steps_by_launch(job.name) == []  # nothing trained
    for record in segment_runs(stack.instance, job.name):  # if the intake was first
        assert record.dagster_run.status in (DagsterRunStatus.CANCELED,
                                             DagsterRunStatus.FAILURE)
    # A resume after it is a new run, and it trains.
    orch.resume(job)
    wait_for("a step of the resumed run", lambda: steps_by_launch(job.name))
    orch.cancel(job.name)
    assert orch.wait(job.name, timeout=120).state == "cancelled"


def run_worker_pid(instance, run_id: str) -> int | None:
    """The run worker's pid, from the engine event its code server records at its start."""
    import re

    for entry in instance.all_logs(run_id):
        found = re.search(r"Started process for run \(pid: (\d+)\)", entry.message or "")
        if found:
            return int(found.group(1))
    return None


def test_a_killed_run_worker_is_failed_and_the_failure_sensor_resumes_it(stack, orch):
    job = small("job-killed", steps=12)
    orch.submit(job)
    wait_for("step 3", lambda: steps_by_launch(job.name) and
             steps_by_launch(job.name)[0][-1] >= 3)
    (record,) = segment_runs(stack.instance, job.name)
    pid = run_worker_pid(stack.instance, record.dagster_run.run_id)
    assert pid, "the run worker process was not found"
    os.kill(pid, signal.SIGKILL)  # no cleanup of its own: the launcher's process is gone
    run = orch.wait(job.name, timeout=300)
    assert run.state == "succeeded", run
    first, *resumed = segment_runs(stack.instance, job.name)
    killed = stack.instance.get_run_by_id(first.dagster_run.run_id)
    assert killed.status == DagsterRunStatus.FAILURE
    assert killed.tags["fm/decision"] == "resumed"
    messages = " ".join(e.message or "" for e in stack.instance.all_logs(killed.run_id))
    assert "signal 9" in messages or "is gone" in messages, messages[-2000:]
    assert resumed and resumed[0].dagster_run.tags["fm/resumes_run"] == killed.run_id
    # The killed run's trainer stopped (the kernel sent it SIGTERM) before the resume
    # trained: no step trained twice by two trainers at once.
    launches = steps_by_launch(job.name)
    assert launches[-1][-1] == 12
    assert launches[1][0] <= launches[0][-1] + 1
