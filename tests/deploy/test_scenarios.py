"""Deployments as users run them, end to end, with real training jobs:

- PostgreSQL (a real server) under `dagster-daemon`, `dagster-webserver` and `fm api serve`:
  2 jobs from 2 tenants, an injected failure in one; every job reaches its target step, the
  failure resumed by the daemon's sensors, the other job trained in one segment, no segment
  launched twice, the restore drill run by the schedule, the lineage read through the
  webserver's GraphQL.
- The sqlite default with two `fm api serve` processes on one FM_HOME (they share one
  daemon): 4 simultaneous submissions from 3 tenants, half to each server, an injected
  failure in one job (the shared daemon resumes it, whichever server took it); every request
  answers, every job reaches its target step, no segment launched twice, both servers report
  every job the same way.
"""

from __future__ import annotations

import collections
import threading

import httpx
import pytest
from dagster import DagsterRunStatus
from fm_pipeline.deploy.instance import Postgres
from fm_pipeline.orchestration.registry import plant_fault
from fm_pipeline.storage import open_store
from tests.api.conftest import TENANTS
from tests.conftest import free_port
from tests.deploy.postgres import postgres_server
from tests.deploy.stack import deployment, wait_for
from tests import local_site

pytestmark = [pytest.mark.slow, pytest.mark.server]
STEPS = 8
THREE_TENANTS = {**TENANTS, "tenants": [*TENANTS["tenants"], {
    "name": "vision", "weight": 1, "quota": {"gpu": 8}, "priorities": ["normal"]}]}


def body(mix_store, priority: str) -> dict:
    return {"model": "debug", "gpus": 1, "parallelism": {"tp": 1, "pp": 1, "dp": 1},
            "checkpoint_every_steps": 4, "data_manifest": mix_store["manifest"],
            "priority": priority, "steps": STEPS}


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {local_site.token_store().issue(tenant=tenant)[1]}"}


def submit(base: str, headers: dict, payload: dict, store, *, fault: bool = True) -> str:
    """POST a job, then plant one fault in it (rank 0 fails after step 6, in whichever
    segment reaches it: the first segment has not launched yet when this returns)."""
    r = httpx.post(f"{base}/v1/training/jobs", json=payload, headers=headers, timeout=60)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    if fault:
        plant_fault(store, job_id, "0:6")
    return job_id


def check_trained_in_one_segment(instance, job_ids: list[str]) -> None:
    for job_id in job_ids:
        (segment,) = [r.dagster_run for r in instance.get_run_records()
                      if r.dagster_run.job_name == "training_segment_job"
                      and r.dagster_run.tags.get("dagster/partition") == job_id]
        assert segment.status == DagsterRunStatus.SUCCESS
        assert int(segment.tags["fm/end_step"]) == STEPS


def check_every_job_recovered(instance, job_ids: list[str]) -> None:
    """Each job: one failed segment (the fault), resumed by the daemon's sensors, ended at
    the target; across the instance, no run key used twice."""
    records = list(instance.get_run_records(ascending=True))
    keys = collections.Counter(r.dagster_run.tags.get("dagster/run_key") for r in records
                               if r.dagster_run.tags.get("dagster/run_key"))
    assert [k for k, n in keys.items() if n > 1] == []
    for job_id in job_ids:
        segments = [r.dagster_run for r in records
                    if r.dagster_run.job_name == "training_segment_job"
                    and r.dagster_run.tags.get("dagster/partition") == job_id]
        failed = [s for s in segments if s.status == DagsterRunStatus.FAILURE]
        assert len(failed) == 1, "\n".join(f"{s.status.value}: {s.tags.get('fm/failure')}"
                                            for s in segments)
        assert failed[0].tags["fm/decision"] == "resumed"
        assert "InjectedFault" in failed[0].tags["fm/failure"]
        (resume,) = [s for s in segments if s.tags.get("fm/resumes_run") == failed[0].run_id]
        assert resume.tags["dagster/sensor_name"] in ("segment_failure_sensor",
                                                      "segment_progress_sensor")
        assert resume.status == DagsterRunStatus.SUCCESS
        assert int(segments[-1].tags["fm/end_step"]) == STEPS
        assert segments[0].tags["dagster/sensor_name"] == "run_intake_sensor"


def processes_naming(path) -> list[str]:
    """Command lines of live processes that name `path` (a test's FM_HOME)."""
    from pathlib import Path

    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in argv and "pytest" not in argv:
            found.append(argv[:300])
    return found


def job_status(base: str, headers: dict, job_id: str) -> dict:
    return httpx.get(f"{base}/v1/training/jobs/{job_id}", headers=headers, timeout=30).json()


_LINEAGE = """
query Lineage($partition: String!) {
  segments: assetOrError(assetKey: {path: ["training_segment"]}) {
    ... on Asset { assetMaterializations(partitions: [$partition]) { runId partition } } }
  checkpoints: assetOrError(assetKey: {path: ["checkpoint"]}) {
    ... on Asset { assetMaterializations(partitions: [$partition]) { runId partition } } }
  drills: assetOrError(assetKey: {path: ["restore_drill"]}) {
    ... on Asset { assetMaterializations(partitions: [$partition]) { runId partition } } }
  runsOrError(filter: {tags: [{key: "fm/api_job_id", value: $partition}]}) {
    ... on Runs { results { runId status } } }
}"""


def test_postgres_deployment_daemon_webserver_and_api(fm_home, mix_store, monkeypatch):
    monkeypatch.setenv("FM_STORE_URI", mix_store["root"])
    store = open_store(mix_store["root"])
    env = {"FM_STORE_URI": mix_store["root"], "FM_RETRY_BACKOFF_S": "1",
           "FM_DRILL_CRON": "* * * * *"}
    with postgres_server() as url, deployment(fm_home, storage=Postgres(url), env=env,
                                              webserver_port=free_port()) as stack, \
            stack.api_server(TENANTS) as base:
        assert (fm_home / "dagster" / "dagster.yaml").read_text().count("postgres_url") == 1
        prod, research = bearer("prod"), bearer("research")
        faulted = submit(base, prod, body(mix_store, "high"), store)
        clean = submit(base, research, body(mix_store, "normal"), store, fault=False)
        jobs = {faulted: prod, clean: research}
        for job_id, headers in jobs.items():
            wait_for(f"{job_id} to succeed", lambda: job_status(
                base, headers, job_id)["status"] == "succeeded", timeout_s=600, every_s=1)
            status = job_status(base, headers, job_id)
            assert status["step"] == STEPS and status["last_ckpt_step"] == STEPS
        check_every_job_recovered(stack.instance, [faulted])
        check_trained_in_one_segment(stack.instance, [clean])
        # The drill schedule (every minute here) drills each job's newest checkpoint.
        drilled = wait_for("the scheduled drills", lambda: {
            r.dagster_run.tags.get("dagster/partition") for r in stack.instance.get_run_records()
            if r.dagster_run.job_name == "restore_drill_job"
            and r.dagster_run.tags.get("dagster/schedule_name") == "restore_drill_schedule"
            and r.dagster_run.status == DagsterRunStatus.SUCCESS} >= set(jobs) or None,
            timeout_s=240, every_s=2)
        assert drilled
        # The lineage, as the UI shows it: through the webserver's GraphQL.
        for job_id in jobs:
            reply = httpx.post(f"{stack.webserver_url}/graphql", timeout=60, json={
                "query": _LINEAGE, "variables": {"partition": job_id}}).json()
            assert "errors" not in reply, reply
            data = reply["data"]
            runs = {r["runId"]: r["status"] for r in data["runsOrError"]["results"]}
            segments = data["segments"]["assetMaterializations"]
            succeeded = {run_id for run_id, state in runs.items() if state == "SUCCESS"}
            assert segments and {s["runId"] for s in segments} <= succeeded
            assert sorted(runs.values()).count("FAILURE") == (job_id == faulted)
            assert data["checkpoints"]["assetMaterializations"]
            assert data["drills"]["assetMaterializations"]
    # Stopped means stopped: no process of the deployment (code servers included) outlives it.
    assert processes_naming(fm_home) == []


def test_two_api_servers_on_one_sqlite_instance_four_submissions_at_once(
        fm_home, mix_store, monkeypatch):
    monkeypatch.setenv("FM_STORE_URI", mix_store["root"])
    store = open_store(mix_store["root"])
    env = {"FM_STORE_URI": mix_store["root"], "FM_RETRY_BACKOFF_S": "1"}
    with deployment(fm_home, env=env, with_daemon=False) as stack, \
            stack.api_server(THREE_TENANTS, keep_daemon=True, name="api-a") as first, \
            stack.api_server(THREE_TENANTS, keep_daemon=True, name="api-b") as second:
        # (server, tenant, priority, a fault planted)
        asks = [(first, bearer("prod"), "high", True),
                (second, bearer("research"), "normal", False),
                (first, bearer("vision"), "normal", False),
                (second, bearer("prod"), "low", False)]
        jobs: dict[str, tuple] = {}
        faulted: list[str] = []
        errors: list[BaseException] = []
        go = threading.Barrier(len(asks))

        def ask(base, headers, priority, fault):
            try:
                go.wait()
                job_id = submit(base, headers, body(mix_store, priority), store, fault=fault)
                jobs[job_id] = headers
                if fault:
                    faulted.append(job_id)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=ask, args=a) for a in asks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(jobs) == 4, errors
        for base in (first, second):  # neither server hung
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        for job_id, headers in jobs.items():
            wait_for(f"{job_id} to succeed", lambda: job_status(
                first, headers, job_id)["status"] == "succeeded", timeout_s=900, every_s=1)
            seen = [job_status(base, headers, job_id) for base in (first, second)]
            assert [s["status"] for s in seen] == ["succeeded"] * 2
            assert seen[0]["step"] == seen[1]["step"] == STEPS
        check_every_job_recovered(stack.instance, faulted)
        check_trained_in_one_segment(stack.instance, [j for j in jobs if j not in faulted])
        # One daemon served the instance: the second server shared the first one's.
        assert "already runs for it" in (fm_home / "dagster" / "services" /
                                         "daemon.log").read_text()
