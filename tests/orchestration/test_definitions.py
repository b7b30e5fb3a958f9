"""The code location `dagster dev` loads, and submitting a training job to a running
webserver through GraphQL (what the REST API does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from dagster import DagsterInstance, DagsterRunStatus, DefaultSensorStatus

from fm_pipeline.definitions import defs
from tests.conftest import REPO, free_port
from tests.orchestration.conftest import job_spec
from tests import local_site


def test_definitions_hold_the_training_lineage_jobs_sensors_and_schedule():
    graph = defs.resolve_asset_graph()
    parents = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert parents["training_plan"] == {"data_mix"}
    assert parents["training_segment"] == {"training_plan"}
    assert parents["checkpoint"] == {"training_segment"}
    assert parents["evaluation"] == parents["restore_drill"] == {"checkpoint"}
    for name in ("training_segment_job", "checkpoint_evaluation_job", "restore_drill_job"):
        assert defs.resolve_job_def(name).partitions_def.name == "training_jobs"
    sensors = {s.name: s for s in defs.sensors}
    assert {"segment_failure_sensor", "segment_progress_sensor",
            "checkpoint_evaluation_sensor"} <= set(sensors)
    assert all(s.default_status == DefaultSensorStatus.RUNNING for s in sensors.values())
    (schedule,) = [s for s in defs.schedules if s.name == "restore_drill_schedule"]
    assert schedule.cron_schedule == "0 */6 * * *"


def test_the_drill_cron_comes_from_the_environment_and_is_checked(monkeypatch):
    from fm_pipeline.assets.training.schedules import drill_cron

    monkeypatch.setenv("FM_DRILL_CRON", "*/15 * * * *")
    assert drill_cron() == "*/15 * * * *"
    monkeypatch.setenv("FM_DRILL_CRON", "every hour")
    with pytest.raises(ValueError, match="FM_DRILL_CRON='every hour': expected a 5-field cron"):
        drill_cron()


@pytest.fixture
def webserver(env, fm_home):
    """`dagster-webserver` for this repo's workspace on 127.0.0.1 (stopped by the test)."""
    port = free_port()
    home = fm_home / "dagster"
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-w", str(REPO / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "DAGSTER_HOME": str(home)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("dagster-webserver did not answer within 120 s")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.server
def test_a_training_job_submitted_over_graphql_is_a_queued_segment_run_of_its_partition(
        webserver, fm_home):
    from fm_pipeline.dagster_runs.submit import submit_over_graphql
    from fm_pipeline.resources.store import ObjectStoreResource

    job = job_spec("via-api")
    run_id = submit_over_graphql(job, store=ObjectStoreResource().open(), url=webserver,
                                 tags={"fm/api_job_id": "42"}, site=local_site.site())
    with DagsterInstance.from_config(str(fm_home / "dagster")) as instance:
        run = instance.get_run_by_id(run_id)
        assert instance.has_dynamic_partition("training_jobs", "via-api")
    assert run.job_name == "training_segment_job"
    assert run.tags["dagster/partition"] == "via-api" and run.tags["fm/api_job_id"] == "42"
    assert run.tags["fm/trigger"] == "submit" and run.tags["fm/end_step"] == "4"
    assert run.run_config["ops"]["training_segment"]["config"]["end_step"] == 4
    # Queued: the daemon (`make ui` runs one) dequeues it and the sensors take it from there.
    assert run.status == DagsterRunStatus.QUEUED
