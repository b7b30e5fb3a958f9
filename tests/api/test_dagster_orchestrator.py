"""The API on the Dagster orchestrator, with a real tiny training job (debug model, one CPU
rank, real torchrun segments run in process by PipelineDriver): the seed's calls, an admin
preemption that checkpoints, requeues and resumes without losing a step, a resume from a
chosen older checkpoint (the trainer's --resume-from), and a cancel. Run state is read back
from Dagster run records; the tests check those records and their tags too."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone

import pytest
from dagster import DagsterInstance, DagsterRunStatus
from fm_pipeline.assets.training.api_orchestrator import DagsterOrchestrator
from fm_pipeline.assets.training.api_runs import api_run_records
from fm_pipeline.assets.training.driver import PipelineDriver
from fm_pipeline.resources.launcher_local import LocalLauncher

from fm_pipeline.api.auth import TokenStore
from fm_pipeline.config.paths import runs_dir
from fm_pipeline.scheduling import parse_tenants
from tests.api.conftest import TENANTS, auth

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]
SLOW_STEP = "0:0.5"  # rank 0 sleeps 0.5 s per step: time to act while a run trains


def wait_for(what: str, predicate, timeout_s: float = 150.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def steps_by_launch(job_id: str) -> list[list[int]]:
    """The steps the trainer logged, per torchrun launch, in order."""
    launches: dict[str, list[int]] = {}
    path = runs_dir(job_id) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        if record.get("kind") == "step":
            launches.setdefault(record["segment"], []).append(record["step"])
    return list(launches.values())


def dagster_runs(instance, job_id: str) -> list:
    """The job's segment runs (records), oldest first, with the API run they belong to."""
    return [r for records in api_run_records(instance, job_id).values() for r in records]


@pytest.fixture
def dagster_env(fm_home, mix_store, monkeypatch):
    monkeypatch.setenv("FM_STORE_URI", mix_store["root"])
    monkeypatch.setenv("FM_FAULT_SLOW_RANKS", SLOW_STEP)
    (fm_home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.get()
    orch = DagsterOrchestrator(instance, resources={"launcher": LocalLauncher(echo_output=False)},
                               evaluate_checkpoints=False)
    yield instance, orch
    for name in orch.list():  # nothing keeps training after the test
        orch.cancel(name)
        orch.wait(name, timeout=60)
    instance.dispose()


@pytest.fixture
def api(dagster_env, mix_store, tokens):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane
    from fm_pipeline.api.store import JobStore

    instance, orch = dagster_env
    plane = ControlPlane(tenants=parse_tenants(TENANTS), orchestrator=orch, store=JobStore(),
                         store_root=mix_store["root"])
    with TestClient(create_app(plane, TokenStore(), tick_s=0.2)) as client:
        yield client, instance, orch
    plane.store.close()


def tiny_body(mix_store, steps: int) -> dict:
    return {"model": "debug", "gpus": 1, "parallelism": {"tp": 1, "pp": 1, "dp": 1},
            "checkpoint_every_steps": 2, "data_manifest": mix_store["manifest"],
            "priority": "high", "steps": steps}


def test_seed_calls_preemption_and_resume_from_a_checkpoint_through_dagster(
        api, tokens, mix_store):
    client, instance, orch = api
    prod, admin = auth(tokens["prod"]), auth(tokens["admin"])

    def status() -> dict:
        return client.get(f"/v1/training/jobs/{job_id}", headers=prod).json()

    # 1. submit: the first Dagster run carries the API's tags.
    r = client.post("/v1/training/jobs", json=tiny_body(mix_store, steps=12), headers=prod)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    # 2. status: the run state from Dagster, the step from the trainer's metrics.
    wait_for("step 3", lambda: (status().get("step") or 0) >= 3)
    assert status()["status"] == "running"
    (first,) = dagster_runs(instance, job_id)
    assert first.dagster_run.status == DagsterRunStatus.STARTED
    assert {k: first.dagster_run.tags[k] for k in (
        "fm/api_job_id", "fm/api_run", "fm/tenant", "fm/priority", "fm/trigger",
        "dagster/partition")} == {"fm/api_job_id": job_id, "fm/api_run": "1", "fm/tenant": "prod",
                                  "fm/priority": "high", "fm/trigger": "submit",
                                  "dagster/partition": job_id}

    # Preempted by an admin: the trainer checkpoints and exits 75, the run ends preempted,
    # the control plane requeues the job and it resumes from that checkpoint.
    r = client.post(f"/v1/training/jobs/{job_id}/preempt", headers=admin)
    assert r.status_code == 202 and r.json()["status"] == "preempting"
    wait_for("the resumed run to train", lambda: len(steps_by_launch(job_id)) == 2
             and len(steps_by_launch(job_id)[1]) >= 2)
    before, after = steps_by_launch(job_id)
    stopped_at = before[-1]
    assert after[0] == stopped_at + 1  # no step lost, none repeated
    runs = orch.status(job_id)
    assert [r.state for r in runs] == ["preempted", "running"]
    assert "preempted at a checkpoint" in runs[0].reason
    assert runs[1].resumed_from.endswith(f"step-{stopped_at:08d}")
    preempted = dagster_runs(instance, job_id)[0].dagster_run
    assert preempted.status == DagsterRunStatus.FAILURE
    assert preempted.tags["fm/stop"] == "preempt"
    assert preempted.tags["fm/decision"] == "stopped"  # the sensors left it to the API

    # 3. resume from a chosen older checkpoint while running: stop, restart from there.
    committed = {c["step"] for c in client.get(f"/v1/training/jobs/{job_id}/checkpoints",
                                               headers=prod).json()["checkpoints"]
                 if c["committed"]}
    older = min(committed)  # retention keeps the newest few
    assert older < max(committed)
    asked_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    r = client.post(f"/v1/training/jobs/{job_id}/resume",
                    json={"checkpoint": f"step-{older:08d}"}, headers=prod)
    assert r.status_code == 202 and r.json()["status"] == "restarting", r.text
    wait_for("the job to finish", lambda: status()["status"] == "succeeded")
    final = status()
    assert final["step"] == 12 and final["last_ckpt_step"] == 12 and final["runs"] == 3
    launches = steps_by_launch(job_id)
    assert launches[2][0] == older + 1 and launches[2][-1] == 12  # restarted from `older`
    assert [r.state for r in orch.status(job_id)] == ["preempted", "preempted", "succeeded"]
    last = dagster_runs(instance, job_id)[-1].dagster_run
    assert last.status == DagsterRunStatus.SUCCESS
    assert last.tags["fm/api_run"] == "3" and last.tags["fm/trigger"] == "api_resume"
    assert last.tags["fm/resume_from"].endswith(f"step-{older:08d}")
    # One Dagster segment run per API run: no sensor resumed a stopped run on its own.
    assert len(dagster_runs(instance, job_id)) == 3
    # The job went on from `older`: every checkpoint after it is either of the new timeline
    # or superseded (kept, never resumed from), none of the abandoned one is selectable.
    for c in client.get(f"/v1/training/jobs/{job_id}/checkpoints",
                        headers=prod).json()["checkpoints"]:
        if c["committed"] and c["step"] > older:
            assert (c["created_at"] > asked_at if c["superseded"] is None else
                    f"resumed from step {older} at" in c["superseded"]), c


def test_cancel_ends_the_dagster_run_canceled_and_nothing_resumes_it(dagster_env):
    from fm_pipeline.data.testing import small_job

    instance, orch = dagster_env
    job = small_job(**{"name": "job-cancelled", "training.steps": 40,
                       "training.segment_steps": 40, "tenant": "research"})
    orch.submit(job)
    wait_for("a step", lambda: steps_by_launch(job.name))
    assert orch.status(job.name)[-1].state == "running"
    orch.cancel(job.name)
    run = orch.wait(job.name, timeout=120)
    assert run.state == "cancelled" and "cancelled by the control plane" in run.reason
    (record,) = dagster_runs(instance, job.name)
    assert record.dagster_run.status == DagsterRunStatus.CANCELED
    assert record.dagster_run.tags["fm/stop"] == "cancel"
    assert steps_by_launch(job.name)[0][-1] < 40
    # The sensors, as the daemon would tick them, request nothing for it.
    assert PipelineDriver(instance).tick_job(job.name, evaluate=False) == []
    assert orch.list() == ["job-cancelled"]


class StoppableLauncher:
    """Stands in for the launcher resource (local or Kubernetes): a segment runs until
    `stop_segments` names its job, then ends as a trainer that checkpointed and exited 75
    would. A stop that comes before the segment started is missed, as a flag older than
    the trainer or a JobSet not yet submitted would be."""

    def __init__(self):
        self.stops: list[tuple[str, str]] = []
        self.launched: list[int] = []
        self._running: str | None = None
        self._stopped = threading.Event()

    def launch_segment(self, context, *, job, end_step, **_):
        from fm_pipeline.resources.launcher_results import segment_failure

        from fm_pipeline.launch.outcome import Outcome, SegmentResult

        self._stopped.clear()
        self._running = job.name
        self.launched.append(end_step)
        try:
            assert self._stopped.wait(60), "the control plane never stopped the segment"
        finally:
            self._running = None
        raise segment_failure(SegmentResult(
            job=job.name, end_step=end_step, outcome=Outcome.PREEMPTED, exit_code=75,
            reason="preempted at step 3; checkpoint step-00000003", torchrun_exit_code=1,
            duration_s=1.0))

    def stop_segments(self, job_name: str, *, reason: str) -> list[str]:
        self.stops.append((job_name, reason))
        if self._running != job_name:
            return []
        self._stopped.set()
        return [job_name]


def test_preempt_and_cancel_stop_the_segment_through_the_launcher(fm_home, mix_store,
                                                                  monkeypatch):
    """Whatever runs the segment (a JobSet on Kubernetes here, in effect), the control plane
    stops it through the launcher's stop_segments, with the reason."""
    from fm_pipeline.data.testing import small_job

    monkeypatch.setenv("FM_STORE_URI", mix_store["root"])
    (fm_home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.get()
    launcher = StoppableLauncher()
    orch = DagsterOrchestrator(instance, resources={"launcher": launcher},
                               evaluate_checkpoints=False)
    job = small_job(**{"name": "job-on-k8s", "training.steps": 40,
                       "training.segment_steps": 40, "tenant": "research"})
    try:
        orch.submit(job)
        wait_for("the segment to launch", lambda: launcher._running)
        orch.preempt(job.name)
        run = orch.wait(job.name, timeout=60)
        assert run.state == "preempted" and "preempted at step 3" in run.reason
        assert launcher.stops[0] == (job.name, "preempt")
        (record,) = dagster_runs(instance, job.name)
        assert record.dagster_run.tags["fm/stop"] == "preempt"
        assert record.dagster_run.tags["fm/decision"] == "stopped"

        orch.resume(job)
        wait_for("the resumed segment to launch", lambda: launcher._running)
        orch.cancel(job.name)
        run = orch.wait(job.name, timeout=60)
        assert run.state == "cancelled"
        assert launcher.stops[-1] == (job.name, "cancel")
        assert launcher.launched == [40, 40]  # nothing resumed a stopped run on its own
    finally:
        instance.dispose()
