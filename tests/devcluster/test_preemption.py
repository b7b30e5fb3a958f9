"""Checkpoint-aware preemption by the real Kueue, through the REST API, on a Kubernetes pool
(admission: kueue). A low-priority research job borrows prod's unused quota and trains; a
high-priority prod job arrives; Kueue reclaims the quota by evicting the low one's
Workload; the JobSet controller suspends its Job, the pods are deleted with their grace
period, the preStop hook touches the trainer's flag, the trainer checkpoints at its next
step and exits 75; the Dagster failure sensor resumes the job, whose new JobSet waits in
Kueue (the API says queued, and why) until the high one finishes, then resumes at the step
it checkpointed. Then an admin preempts it through the API (the control plane's own stop:
the run terminated, the JobSet deleted gracefully, the same flag) and it resumes again;
every step is trained once. The whole deployment is real: the Dagster daemon starts every run, the
KubernetesLauncher submits JobSets to the real apiserver, JobSet and Kueue controllers."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from dagster import DagsterRunStatus

from fm_pipeline.defaults import DEV_CLUSTER_TENANTS
from fm_pipeline.scheduling import parse_tenants
from tests import local_site
from tests.api.conftest import auth
from tests.deploy.stack import deployment, wait_for
from tests.devcluster.conftest import started
from tests.devcluster.objects import prepare_namespace

pytestmark = [pytest.mark.slow, pytest.mark.server]

# Four CPUs in the cohort, two guaranteed to each tenant: a 2x2 research job borrows
# prod's two, and a 1x2 prod job within its quota takes them back.
TENANTS = {**yaml.safe_load(DEV_CLUSTER_TENANTS.read_text()),
           "pool": {"gpu": 4, "cpu": 4},
           "tenants": [
               {"name": "research", "quota": {"gpu": 2, "cpu": 2}, "priorities": ["low"]},
               {"name": "prod", "quota": {"gpu": 2, "cpu": 2}, "priorities": ["high"]}],
           "preemption": {"max_per_job_per_hour": 2, "grace_s": 20}}
# Rank 0 sleeps 1 s per step in every pod: time to act while it trains. The low job runs
# its 40 steps as one segment (~40 s), so Kueue's eviction lands inside a launch that is
# training: with the default 20-step segments CI's machine once took longer than the
# first segment's remaining 17 s from the high job's submission to the eviction, which
# then met the next segment's JobSet before it trained (nothing for the trainer to stop).
SLOW_STEP = "0:1.0"
STEPS = 40


@pytest.fixture(scope="module")
def cluster(components, tmp_path_factory, cpu_peaks_file):
    with started(components, tmp_path_factory.mktemp("dev-cluster"),
                 tenants=parse_tenants(TENANTS),
                 image_env={"FM_FAULT_SLOW_RANKS": SLOW_STEP}) as info:
        yield info


@pytest.fixture
def api(cluster, kube, fm_home, s3_bucket, s3_endpoint, tokens):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.control_plane import ControlPlane
    from fm_pipeline.dagster_runs.orchestrator import DagsterOrchestrator
    from fm_pipeline.data.testing import build_small_mix, small_job

    store_uri = f"s3://{s3_bucket}/fm"
    site = local_site.site().with_store(store_uri, s3_endpoint=s3_endpoint)
    mix = build_small_mix(small_job(), store=site.store())
    for ns in ("research", "prod"):
        prepare_namespace(kube, ns)
    env = {"FM_LAUNCHER": "kubernetes", "FM_STORE_URI": store_uri,
           "FM_S3_ENDPOINT_URL": s3_endpoint, "FM_K8S_KUBECONFIG": cluster.kubeconfig,
           "FM_K8S_SHARED_CLAIM": "fm-runs", "FM_K8S_CREDENTIALS_SECRET": "s3-credentials",
           "FM_K8S_POLL_S": "0.5"}
    with deployment(fm_home, env=env) as stack:
        plane = ControlPlane(tenants=parse_tenants(TENANTS), store=local_site.job_store(),
                             orchestrator=DagsterOrchestrator(stack.instance, site=site),
                             site=site)
        with TestClient(create_app(plane, local_site.token_store(), tick_s=0.2)) as client:
            yield client, stack, site, mix.key
        for record in stack.instance.get_run_records():  # nothing keeps running after
            if record.dagster_run.status in (DagsterRunStatus.STARTED, DagsterRunStatus.QUEUED):
                stack.instance.run_coordinator.cancel_run(record.dagster_run.run_id)
        plane.store.close()


@pytest.fixture
def tokens(fm_home) -> dict[str, str]:
    store = local_site.token_store()
    return {name: store.issue(tenant=None if name == "admin" else name)[1]
            for name in ("research", "prod", "admin")}


def _body(mix_key: str, *, gpus: int, priority: str, steps: int) -> dict:
    return {"model": "debug", "gpus": gpus, "gpus_per_node": 2,
            "parallelism": {"tp": 1, "pp": 1, "dp": gpus}, "priority": priority,
            "checkpoint_every_steps": 1000, "steps": steps, "segment_steps": steps,
            "data_manifest": mix_key}


def _steps(cluster, ns: str, job_id: str) -> dict[str, list[int]]:
    """The steps rank 0 logged per segment launch, from the namespace's shared claim (the
    pods' run directory)."""
    path = Path(cluster.state) / "claims" / ns / "fm-runs" / job_id / "metrics.jsonl"
    launches: dict[str, list[int]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        if record.get("kind") == "step":
            launches.setdefault(record["segment"], []).append(record["step"])
    return launches


def _segments(cluster, ns: str, job_id: str) -> list[dict]:
    """The trainer's record of each segment launch (start, end, exit reason), in order, from
    the namespace's shared claim."""
    path = Path(cluster.state) / "claims" / ns / "fm-runs" / job_id / "segments.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_kueue_evicts_the_low_priority_job_which_checkpoints_waits_and_resumes_at_that_step(
        api, cluster, kube, tokens):
    client, stack, site, mix_key = api
    research, prod, admin = (auth(tokens[t]) for t in ("research", "prod", "admin"))

    def status(job_id: str, who: dict) -> dict:
        return client.get(f"/v1/training/jobs/{job_id}", headers=who).json()

    def kinds(job_id: str, who: dict) -> list[str]:
        return [e["kind"] for e in client.get(f"/v1/training/jobs/{job_id}/events",
                                              headers=who).json()["events"]]

    r = client.post("/v1/training/jobs", headers=research,
                    json=_body(mix_key, gpus=4, priority="low", steps=STEPS))
    assert r.status_code == 201, r.text
    low = r.json()["job_id"]
    wait_for("the low job to train", lambda: sum(map(len, _steps(cluster, "research", low)
                                                      .values())) >= 3, timeout_s=300)
    assert status(low, research)["status"] == "running"

    r = client.post("/v1/training/jobs", headers=prod,
                    json=_body(mix_key, gpus=2, priority="high", steps=4))
    assert r.status_code == 201, r.text
    high = r.json()["job_id"]

    # Kueue, not the API, preempts: the low job's Workload is evicted to reclaim prod's
    # quota, its trainer checkpoints inside the grace period and exits 75, and the job
    # waits in Kueue for the quota to come back.
    wait_for("the low job to wait in Kueue after its eviction",
             lambda: "kueue_evicted" in kinds(low, research)
             and status(low, research)["status"] == "queued", timeout_s=300)
    queued = status(low, research)
    assert queued["preemptions"] == 1
    assert queued["queued_by"].startswith(("evicted by Kueue", "queued in Kueue")), queued
    (evicted,) = [e for e in client.get(f"/v1/training/jobs/{low}/events",
                                        headers=research).json()["events"]
                  if e["kind"] == "kueue_evicted"]
    assert evicted["detail"]["reason"] == "Preempted"
    assert "reclamation within the cohort" in evicted["detail"]["message"], evicted
    before = _steps(cluster, "research", low)
    (first,) = before.values()
    stopped_at = first[-1]
    assert stopped_at <= STEPS - 6, f"evicted at step {stopped_at}: too late to test the rest"
    store = site.store()
    manifest_key = f"checkpoints/{low}/step-{stopped_at:08d}/manifest.json"
    assert store.exists(manifest_key), "the evicted trainer did not checkpoint its last step"

    wait_for("the high job to finish", lambda: status(high, prod)["status"] == "succeeded",
             timeout_s=300)
    # Readmitted once the high job is done, it resumes; then an admin preempts it through
    # the API (the control plane's own preemption: the run is terminated, its JobSet
    # deleted gracefully, the same preStop flag), and it resumes again. The admin acts two
    # steps into the resumed launch, away from its start and end (a stop that lands as a
    # segment completes once also stopped the next launch: issue 37's note, left to fix).
    after = stopped_at + 2
    wait_for("the readmitted job to train", lambda: any(
        step >= after for steps in _steps(cluster, "research", low).values()
        for step in steps), timeout_s=300)
    r = client.post(f"/v1/training/jobs/{low}/preempt", headers=admin)
    assert r.status_code == 202 and r.json()["status"] == "preempting", r.text
    wait_for("the low job to finish", lambda: status(low, research)["status"] == "succeeded",
             timeout_s=400)
    final = status(low, research)
    assert final["step"] == STEPS and final["last_ckpt_step"] == STEPS
    assert final["preemptions"] == 2  # Kueue's eviction and the admin's
    # Every step trained once: none lost, none repeated, across both stops.
    launches = list(_steps(cluster, "research", low).values())
    assert sorted(s for steps in launches for s in steps) == list(range(1, STEPS + 1)), launches
    # The two stops, from the trainer's segment records (an eviction just before a segment
    # boundary is followed by a launch of one step, then the next segment's: positions in
    # the list of launches say nothing).
    segments = [(r["start_step"], r["end_step"], r["exit_reason"])
                for r in _segments(cluster, "research", low)]
    stops = [i for i, (_, _, why) in enumerate(segments) if why == "preempted"]
    assert len(stops) == 2 and segments[stops[0]][1] == stopped_at, segments
    for i in stops:  # each stopped launch is followed by one starting at its checkpoint
        assert segments[i + 1][0] == segments[i][1], segments
    at = segments[stops[1]][1]  # the step the admin's stop checkpointed
    # Kueue's decisions as the API lists them (a JobSet may be seen queued before each
    # admission, or not, by the launcher's polls).
    kueue = [k for k in kinds(low, research) if k.startswith("kueue_") and k != "kueue_queued"]
    assert kueue[:3] == ["kueue_admitted", "kueue_evicted", "kueue_admitted"], kueue
    assert kueue.count("kueue_evicted") == 1  # the admin's stop is not Kueue's
    from fm_pipeline.dagster_runs.api_jobs import api_run_records

    runs = [r.dagster_run for records in api_run_records(stack.instance, low).values()
            for r in records]
    # The evicted segment failed preempted (the failure sensor resumed it); the one the
    # admin stopped was cancelled after its checkpoint (the control plane requeued it).
    assert runs[0].status == DagsterRunStatus.FAILURE
    assert runs[0].tags["fm/outcome"] == "preempted" and runs[0].tags["fm/exit_code"] == "75"
    assert runs[1].tags["fm/resume_from"].endswith(f"step-{stopped_at:08d}")
    (cancelled,) = [i for i, r in enumerate(runs) if r.status == DagsterRunStatus.CANCELED]
    assert runs[cancelled].tags["fm/stop"] == "preempt"
    # The admin's stop checkpointed the step it ended at, and the next launch started right
    # after it. The requeued run's request planned the newest checkpoint when it was made;
    # the admin's may commit after that, and the launch then follows it and the event log
    # says so (segment_replanned): the request's plan is never ahead of the launch.
    assert stopped_at < at < STEPS, segments
    planned = int(runs[cancelled + 1].tags["fm/resume_from"].rsplit("step-", 1)[1])
    assert stopped_at <= planned <= at
    if planned < at:
        assert "segment_replanned" in kinds(low, research)
    assert runs[-1].status == DagsterRunStatus.SUCCESS
    # Eviction (Kueue's clock, whole seconds) to the committed checkpoint: inside the
    # grace period the tenants file gives.
    written = datetime.fromisoformat(json.loads(store.get_bytes(manifest_key))["created_at"]
                                     .replace("Z", "+00:00")).timestamp()
    evict_to_checkpoint_s = written - evicted["detail"]["evicted_at"]
    print(f"eviction to committed checkpoint: {evict_to_checkpoint_s:.2f} s")
    assert -1.0 <= evict_to_checkpoint_s < 20, evict_to_checkpoint_s

