"""The seed's job against a pool that can hold it: a tenants config naming what the pool is
made of (an H100 cluster behind Kubernetes) makes the API accept, plan, critique and render
the 2,048-GPU fm-100b job; the local pool refuses it listing every problem at once."""

from __future__ import annotations

import pytest
import yaml
from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_validate import validate_object
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.scheduling import TenantsConfigError, parse_tenants
from tests.api.conftest import TENANTS, auth
from tests.api.orchestrators import RecordingOrchestrator
from tests.scheduling.trace import Clock
from tests import local_site

H100_POOL = {**TENANTS, "pool": {"gpu": 4096}, "launcher": "kubernetes",
             "cluster": {"accelerator": "h100", "gpus_per_node": 8, "storage_write_gbps": 10.0}}


@pytest.fixture
def cluster_client(fm_home, mix_store):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane

    clock = Clock()
    clock.now = 1_800_000_000.0
    plane = ControlPlane(tenants=parse_tenants(H100_POOL), store=local_site.job_store(),
                         orchestrator=RecordingOrchestrator(clock),
                         clock=clock, site=local_site.site().with_store(mix_store["root"]))
    tokens = local_site.token_store()
    prod = tokens.issue(tenant="prod")[1]
    with TestClient(create_app(plane, local_site.token_store())) as c:
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
    job = plane.job_spec(job_id)
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


@pytest.fixture(scope="module")
def long_mix(tmp_path_factory):
    """A real small mix prepared at seq_len 4096 (the seed job's declared sequence length)."""
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.storage import open_store
    from tests.api.conftest import mix_in

    root = tmp_path_factory.mktemp("long-mix")
    job = small_job(**{"training.seq_len": 4096, "data.shard_tokens": 65536,
                       "model.max_seq_len": 4096})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FM_HOME", str(root / "home"))
        mix = build_small_mix(job, store=open_store(root / "store"))
    return mix_in(root / "store", mix.key)


def _long_client(long_mix):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane

    clock = Clock()
    clock.now = 1_800_000_000.0
    plane = ControlPlane(tenants=parse_tenants(H100_POOL), store=local_site.job_store(),
                         orchestrator=RecordingOrchestrator(clock),
                         clock=clock, site=local_site.site().with_store(long_mix["root"]))
    return TestClient(create_app(plane, local_site.token_store())), plane


def _check_warnings_are_true(job, warnings: list[dict]) -> None:
    """Each finding's numbers, recomputed with the planner's own model."""
    from fm_pipeline.planner.critique import (
        GRACE_MARGIN,
        SEGMENT_RELAUNCH_SHARE,
        relaunch_share,
    )
    from fm_pipeline.planner.job_plan import estimate_job, job_inputs
    from fm_pipeline.planner.reliability import reliability

    inp = job_inputs(job)
    est = estimate_job(inp)
    for w in warnings:
        if w["field"] == "training.segment_steps":
            declared = relaunch_share(est, job.training.segment_steps)
            assert f"{declared:.0%} of the wall clock" in w["message"]
            assert declared > SEGMENT_RELAUNCH_SHARE
            if "keeps it under" in w["message"]:
                assert relaunch_share(est, w["suggested"]) <= SEGMENT_RELAUNCH_SHARE
            else:
                assert w["suggested"] == job.training.steps
                assert relaunch_share(est, job.training.steps) > SEGMENT_RELAUNCH_SHARE
        elif w["field"] == "training.preemption_grace_s":
            rel = est.reliability
            assert job.training.preemption_grace_s < (
                rel.checkpoint_blocking_s + rel.checkpoint_write_s) * GRACE_MARGIN
            assert w["suggested"] >= (rel.checkpoint_blocking_s + rel.checkpoint_write_s
                                      ) * GRACE_MARGIN
        elif w["field"] == "checkpoint.every_steps":
            def goodput(steps):
                return reliability(params=inp["shape"].params().total, gpus=inp["layout"].gpus,
                                   cluster=inp["cluster"], step_time_s=est.metrics["step_time_s"],
                                   async_save=inp["async_checkpoint"],
                                   interval_steps=steps).goodput
            assert goodput(w["suggested"]) >= goodput(job.checkpoint.every_steps)
        else:
            raise AssertionError(f"a warning no test checks: {w['field']}")


def test_the_seeds_exact_job_is_planned_at_its_declared_sequence_and_batch(fm_home, long_mix):
    prod = local_site.token_store().issue(tenant="prod")[1]
    client, plane = _long_client(long_mix)
    body = {**seed_call(long_mix), "seq_len": 4096, "global_batch_tokens": 4096 * 1024,
            "training_tokens": 2 * 10**12, "precision": "bf16"}
    body.pop("steps")
    with client:
        r = client.post("/v1/training/jobs", json=body, headers=auth(prod))
        assert r.status_code == 201, r.text
        job = plane.job_spec(r.json()["job_id"])
        assert (job.training.seq_len, job.training.global_batch_size) == (4096, 1024)
        assert job.training.steps == -(-2 * 10**12 // (4096 * 1024)) == 476_838
        assert job.parallelism.mixed_precision == "bf16"
        warnings = r.json()["warnings"]
        # The stored spec (what every later plan reads) critiques exactly as submitted.
        from fm_pipeline.api.control_plane import critique_of
        assert critique_of(job) == warnings
        assert {w["field"] for w in warnings} >= {"training.segment_steps"}
        _check_warnings_are_true(job, warnings)
        rendered = render_segment(SegmentLaunch(job, end_step=job.training.segment_steps),
                                  KubernetesTarget(store_uri="s3://fm-bucket/fm"))
        for obj in rendered.objects():
            validate_object(obj)

        # A job too short to amortise a relaunch is told so, not promised what it cannot be.
        short = {**body, "training_tokens": 60 * 4096 * 1024}
        r = client.post("/v1/training/jobs", json=short, headers=auth(prod))
        assert r.status_code == 201, r.text
        job = plane.job_spec(r.json()["job_id"])
        seg = [w for w in r.json()["warnings"] if w["field"] == "training.segment_steps"]
        assert seg and "too short" in seg[0]["message"], r.json()["warnings"]
        _check_warnings_are_true(job, r.json()["warnings"])

        # The segment length a warning suggests is one the body can give, and it silences it.
        (suggested,) = [w["suggested"] for w in warnings if w["field"] == "training.segment_steps"]
        r = client.post("/v1/training/jobs", json={**body, "segment_steps": suggested},
                        headers=auth(prod))
        assert r.status_code == 201, r.text
        assert plane.job_spec(r.json()["job_id"]).training.segment_steps == suggested
        assert "training.segment_steps" not in {w["field"] for w in r.json()["warnings"]}

        # What the mix cannot feed, and declarations that disagree, are named.
        bad = {**body, "seq_len": 8192, "global_batch_size": 100}
        r = client.post("/v1/training/jobs", json=bad, headers=auth(prod))
        assert r.status_code == 422
        found = {tuple(d["loc"][1:]): d["msg"] for d in r.json()["detail"]}
        assert "prepared at seq_len 4096" in found[("seq_len",)]
        assert "disagrees with global_batch_size 100" in found[("global_batch_tokens",)]
    plane.store.close()


def test_the_seed_call_against_the_demo_mix_keeps_its_old_warnings_true(cluster_client,
                                                                         mix_store):
    client, plane, prod = cluster_client
    r = client.post("/v1/training/jobs", json=seed_call(mix_store), headers=auth(prod))
    assert r.status_code == 201, r.text
    _check_warnings_are_true(plane.job_spec(r.json()["job_id"]),
                             r.json()["warnings"])
