"""The seed's job against a pool that can hold it: a tenants config naming what the pool is
made of (an H100 cluster behind Kubernetes) makes the API accept, plan, critique and render
the 2,048-GPU fm-100b job; the local pool refuses it listing every problem at once."""

from __future__ import annotations

import pytest
import yaml

from fm_pipeline.api.auth import TokenStore
from fm_pipeline.config import parse_job
from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_validate import validate_object
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.scheduling import TenantsConfigError, parse_tenants
from tests.api.conftest import TENANTS, auth
from tests.api.orchestrators import RecordingOrchestrator
from tests.scheduling.trace import Clock

H100_POOL = {**TENANTS, "pool": {"gpu": 4096}, "launcher": "kubernetes",
             "cluster": {"accelerator": "h100", "gpus_per_node": 8, "storage_write_gbps": 10.0}}


@pytest.fixture
def cluster_client(fm_home, mix_store):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane
    from fm_pipeline.api.store import JobStore

    clock = Clock()
    clock.now = 1_800_000_000.0
    plane = ControlPlane(tenants=parse_tenants(H100_POOL), store=JobStore(),
                         orchestrator=RecordingOrchestrator(clock),
                         store_root=mix_store["root"], clock=clock)
    tokens = TokenStore()
    prod = tokens.issue(tenant="prod")[1]
    with TestClient(create_app(plane, TokenStore())) as c:
        yield c, plane, prod
    plane.store.close()


def seed_call(mix_store) -> dict:
    return {"model": "fm-100b", "gpus": 2048, "parallelism": {"tp": 8, "pp": 16, "dp": 16},
            "checkpoint_every_steps": 500, "steps": 100_000,
            "data_manifest": mix_store["manifest"], "priority": "high"}


def test_the_seed_job_is_accepted_planned_critiqued_and_rendered_on_an_h100_pool(
        cluster_client, mix_store):
    client, plane, prod = cluster_client
    r = client.post("/v1/training/jobs", json=seed_call(mix_store), headers=auth(prod))
    assert r.status_code == 201, r.text
    warned = {w["field"]: w for w in r.json()["warnings"]}
    assert {"checkpoint.every_steps", "training.segment_steps",
            "training.preemption_grace_s"} <= set(warned)
    assert "every 500 steps" in warned["checkpoint.every_steps"]["message"]
    assert "GPU-hours a day" in warned["checkpoint.every_steps"]["message"]
    # The mix's short sequences make steps of a fraction of a second: 500 of them are
    # shorter than the 1.2 TB write, so the optimum is longer here, not shorter.
    assert warned["checkpoint.every_steps"]["suggested"] not in (None, 500)
    job_id = r.json()["job_id"]
    submitted = [e for e in client.get(f"/v1/training/jobs/{job_id}/events",
                                       headers=auth(prod)).json()["events"]
                 if e["kind"] == "submitted"]
    assert submitted[0]["detail"]["warnings"] == r.json()["warnings"]
    job = parse_job(plane.store.get(job_id).spec)
    assert job.cluster.accelerator == "h100" and job.parallelism.mixed_precision == "bf16"
    assert job.parallelism.world_size == 2048
    rendered = render_segment(SegmentLaunch(job, end_step=job.training.segment_steps),
                              KubernetesTarget(store_uri="s3://fm-bucket/fm"))
    for obj in rendered.objects():
        validate_object(obj)
    gpus = yaml.safe_dump(rendered.jobset)
    assert "nvidia.com/gpu" in gpus


def test_a_pool_made_of_something_the_job_spec_refuses_is_named():
    with pytest.raises(TenantsConfigError, match="cluster") as e:
        parse_tenants({**H100_POOL, "cluster": {"accelerator": "h100", "gpus_per_node": 0}})
    assert "gpus_per_node" in str(e.value)
