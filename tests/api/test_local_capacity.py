"""A pool that feeds the local launcher admits only what this machine can run: the seed's
2,048-GPU job against an H100 pool of 4,096 declared in the tenants file is refused at
submission (no process starts), naming the numbers; a launch that reaches the launcher
anyway starts no torchrun."""

from __future__ import annotations

import os

from fm_pipeline.config import parse_job
from fm_pipeline.launch.capacity import LocalCapacity, local_fit_problems
from fm_pipeline.launch.local import descendants, run_segment_locally
from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.scheduling import parse_tenants
from tests.api.conftest import TENANTS, auth
from tests.api.orchestrators import RecordingOrchestrator
from tests.scheduling.trace import Clock
from tests import local_site

H100_LOCAL_POOL = {**TENANTS, "pool": {"gpu": 4096},
                   "cluster": {"accelerator": "h100", "gpus_per_node": 8}}


def _client(tenants: dict, mix_store, capacity: LocalCapacity | None = None):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane

    clock = Clock()
    clock.now = 1_800_000_000.0
    orchestrator = RecordingOrchestrator(clock)
    plane = ControlPlane(tenants=parse_tenants(tenants), store=local_site.job_store(),
                         orchestrator=orchestrator, clock=clock,
                         capacity=capacity, site=local_site.site().with_store(mix_store["root"]))
    return TestClient(create_app(plane, local_site.token_store())), plane, orchestrator


def seed_call(mix_store) -> dict:
    return {"model": "fm-100b", "gpus": 2048, "parallelism": {"tp": 8, "pp": 16, "dp": 16},
            "checkpoint_every_steps": 500, "steps": 100_000,
            "data_manifest": mix_store["manifest"], "priority": "high"}


def test_the_seed_job_on_a_local_h100_pool_is_refused_naming_this_machine(fm_home, mix_store):
    prod = local_site.token_store().issue(tenant="prod")[1]
    client, plane, orchestrator = _client(H100_LOCAL_POOL, mix_store)  # this machine, measured
    with client:
        r = client.post("/v1/training/jobs", json=seed_call(mix_store), headers=auth(prod))
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "gpus"]
    here = LocalCapacity.of_this_machine()
    assert "2048 ranks of h100" in problem["msg"]
    assert f"{here.cores} CPU cores" in problem["msg"] and f"{here.gpus} GPU" in problem["msg"]
    assert plane.store.list() == [] and orchestrator.calls == []  # nothing queued or started
    plane.store.close()


def test_the_same_job_is_accepted_where_the_pool_feeds_kubernetes(fm_home, mix_store):
    prod = local_site.token_store().issue(tenant="prod")[1]
    client, plane, _ = _client({**H100_LOCAL_POOL, "launcher": "kubernetes"}, mix_store)
    with client:
        r = client.post("/v1/training/jobs", json=seed_call(mix_store), headers=auth(prod))
    assert r.status_code == 201, r.text
    plane.store.close()


def test_cpu_ranks_past_the_cores_and_a_model_past_the_memory_are_named(fm_home, mix_store):
    research = local_site.token_store().issue(tenant="research")[1]
    small = LocalCapacity(cores=2, memory_gib=24.0, gpus=0)
    client, plane, orchestrator = _client(TENANTS, mix_store, capacity=small)
    body = {"model": "debug", "gpus": 16, "parallelism": {"tp": 1, "pp": 1, "dp": 16},
            "gpus_per_node": 16, "checkpoint_every_steps": 10,
            "data_manifest": mix_store["manifest"]}
    with client:
        r = client.post("/v1/training/jobs", json=body, headers=auth(research))
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["body", "gpus"]]
        assert "16 CPU ranks" in r.json()["detail"][0]["msg"]
        assert "more than 8 (4 per core)" in r.json()["detail"][0]["msg"]
        r = client.post("/v1/training/jobs", json={**body, "gpus": 2, "gpus_per_node": 2,
                                                   "model": "llama3-8b",
                                                   "parallelism": {"tp": 1, "pp": 1, "dp": 2}},
                        headers=auth(research))
        assert r.status_code == 422, r.text
        msg = r.json()["detail"][0]["msg"]
        assert r.json()["detail"][0]["loc"] == ["body", "model"] and "at least" in msg
        assert "24.0 GiB memory" in msg
        r = client.post("/v1/training/jobs", json={**body, "gpus": 2, "gpus_per_node": 2,
                                                   "parallelism": {"tp": 1, "pp": 1, "dp": 2}},
                        headers=auth(research))
        assert r.status_code == 201, r.text  # what fits is queued and started
    assert len(orchestrator.calls) == 1
    plane.store.close()


def test_the_local_launcher_starts_no_process_for_a_job_this_machine_cannot_hold(
        fm_home, mix_store):
    from fm_pipeline.data.testing import small_job

    data = small_job().model_dump(mode="json")
    data["cluster"] = {"accelerator": "h100", "gpus_per_node": 8}
    data["parallelism"] = {"nnodes": 256, "nproc_per_node": 8, "tp": 2, "pp": 1}
    data["training"].update(global_batch_size=1024, micro_batch_size=1)
    job = parse_job(data)
    assert local_fit_problems(job, LocalCapacity(cores=2, memory_gib=24.0, gpus=0))
    # This process's own: another test (or xdist's other worker) may start processes.
    before = set(descendants(os.getpid()))
    result = run_segment_locally(SegmentLaunch(job, end_step=job.training.steps), echo=None, site=local_site.site())
    assert result.outcome is Outcome.BAD_CONFIG and result.exit_code == 2
    assert "2048 ranks of h100" in result.reason and "not started" in result.reason
    assert not (set(descendants(os.getpid())) - before)  # no torchrun, no worker
