"""A training segment through `KubernetesLauncher` on the real controllers: Kueue admits
it within the ClusterQueue's quota, the JobSet controller makes the Job, pods and headless
Service, the scheduler places the pods, the ranks meet through PET_MASTER_ADDR, rank 0's
Pipes messages reach Dagster through the pod log the apiserver proxies, and the
checkpoint commits to the store."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from dagster import asset, materialize
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.devcluster.kubelet import lose_pod
from tests import local_site
from tests.devcluster.objects import prepare_namespace

NS = "prod"


def _launcher(cluster, kube, store_uri: str, s3_endpoint: str,
              **settings) -> KubernetesLauncher:
    claim, secret = prepare_namespace(kube, NS)
    return KubernetesLauncher(
        store_uri=store_uri, s3_endpoint_url=s3_endpoint, kubeconfig_file=cluster.kubeconfig,
        credentials_secret=secret, shared_volume_claim=claim, poll_interval_s=0.5,
        **settings)


def _segment(job, end_step: int):
    @asset(required_resource_keys={"launcher"})
    def segment(context):
        return context.resources.launcher.launch_segment(
            context, job=job, end_step=end_step).materialize_result()

    return segment


def _job_with_mix(s3_bucket: str, name: str, *, nproc: int, steps: int, every: int):
    """A 2-node job of the tiny model in the tenant `prod`, its data mix in the store."""
    store_uri = f"s3://{s3_bucket}/fm"
    job = small_job(**{"name": name, "parallelism.nnodes": 2,
                       "parallelism.nproc_per_node": nproc, "training.steps": steps,
                       "checkpoint.every_steps": every, "cluster.namespace": NS,
                       "cluster.local_queue": "prod"})
    store = local_site.site().open_store(store_uri)
    build_small_mix(job, store=store)
    return job, store, store_uri


@pytest.mark.slow
def test_a_two_node_segment_runs_to_completion_on_the_real_controllers(
        cluster, kube, s3_bucket, s3_endpoint):
    job, store, store_uri = _job_with_mix(s3_bucket, "kube2", nproc=2, steps=4, every=100)
    launcher = _launcher(cluster, kube, store_uri, s3_endpoint, timeout_s=300,
                         delete_on_completion=False)
    result = materialize([_segment(job, 4)], resources={"launcher": launcher})
    assert result.success
    (mat,) = result.asset_materializations_for_node("segment")
    assert mat.metadata["outcome"].value == "succeeded"
    # Rank 0's own materialization, through Dagster Pipes in its pod's log (the apiserver
    # proxies pods/log to the process kubelet): only the trainer knows these.
    assert mat.metadata["world_size"].value == 4, sorted(mat.metadata)
    assert mat.metadata["start_step"].value == 0 and mat.metadata["end_step"].value == 4

    name = "kube2-4"
    # Kueue admitted it into the tenant's ClusterQueue; the JobSet controller made the
    # Job, its Service and one pod per node; the scheduler bound them to nodes.
    (workload,) = [w for w in kube.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/"
                                       "workloads")["items"]
                   if w["metadata"]["ownerReferences"][0]["name"] == name]
    conditions = {c["type"]: c for c in workload["status"]["conditions"]}
    assert conditions["Admitted"]["status"] == "True"
    assert workload["status"]["admission"]["clusterQueue"] == "prod"
    assert kube.get(f"/api/v1/namespaces/{NS}/services/{name}")["spec"]["clusterIP"] == "None"
    pods = kube.get(f"/api/v1/namespaces/{NS}/pods",
                    labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}")["items"]
    assert len(pods) == 2
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert all(p["spec"]["nodeName"] in cluster.nodes for p in pods)
    # The checkpoint the four ranks on two nodes committed, in the store.
    manifest = json.loads(store.get_bytes("checkpoints/kube2/step-00000004/manifest.json"))
    assert manifest["step"] == 4
    assert manifest["parallelism"]["world_size"] == 4
    assert manifest["parallelism"]["nnodes"] == 2
    kube.delete(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets/{name}",
                propagation="Foreground")


def _kill_node_after(kube, store, *, name: str, checkpoint_key: str, node_rank: int,
                     killed: list) -> None:
    """Once `checkpoint_key` is in the store, SIGKILL every process of the pod at
    `node_rank` (its torchrun and workers), as a node's container dying would."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not store.exists(checkpoint_key):
        time.sleep(0.2)
    (pod,) = [p for p in kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=(
        f"jobset.sigs.k8s.io/jobset-name={name},"
        f"batch.kubernetes.io/job-completion-index={node_rank}"))["items"]
        if p["status"].get("phase") == "Running"]
    lose_pod(pod["metadata"]["uid"])
    killed.append(pod["metadata"]["name"])


@pytest.mark.slow
def test_a_killed_node_is_restarted_by_the_jobset_and_resumes_from_its_checkpoint(
        cluster, kube, s3_bucket, s3_endpoint):
    job, store, store_uri = _job_with_mix(s3_bucket, "kill2", nproc=1, steps=40, every=4)
    launcher = _launcher(cluster, kube, store_uri, s3_endpoint, timeout_s=400,
                         max_restarts=2)
    killed: list[str] = []
    killer = threading.Thread(target=_kill_node_after, daemon=True, kwargs=dict(
        kube=kube, store=store, name="kill2-40", node_rank=1, killed=killed,
        checkpoint_key="checkpoints/kill2/step-00000004/manifest.json"))
    killer.start()
    result = materialize([_segment(job, 40)], resources={"launcher": launcher})
    killer.join(timeout=10)
    assert killed, "the node was never killed"
    assert result.success
    (mat,) = result.asset_materializations_for_node("segment")
    assert mat.metadata["end_step"].value == 40
    assert "after 1 JobSet restart" in mat.metadata["reason"].value
    # The restarted attempt resumed from a checkpoint committed before the kill, not from
    # scratch: its trainer reported where it started in the leader's Pipes messages.
    assert mat.metadata["start_step"].value >= 4, mat.metadata


@pytest.mark.slow
def test_the_fast_tier_keeper_runs_on_every_node_and_sweeps_what_gone_runs_left(cluster, kube):
    """A job with the fast tier brings the node keeper: the real DaemonSet controller makes
    one pod per node, the scheduler binds them, the process kubelet runs
    `python -m fm_pipeline.checkpoint.fast_keeper` on the node's hostPath, and it deletes
    the snapshots a long-gone run left there. The JobSet itself names a LocalQueue that
    does not exist: it stays queued and runs nothing, the keeper runs anyway."""
    from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
    from fm_pipeline.launch.k8s_client import JobSetClient
    from fm_pipeline.launch.keeper import KEEPER_NAME
    from fm_pipeline.launch.pod import FAST_HOST_PATH
    from fm_pipeline.launch.spec import SegmentLaunch

    month_ago = time.time() - 30 * 86400
    stale = {node: Path(cluster.state) / "nodes" / node / "host" / FAST_HOST_PATH.lstrip("/")
             / "gone-job" / "run-1" for node in cluster.nodes}
    for run in stale.values():
        run.mkdir(parents=True)
        (run / "snapshot.bin").write_bytes(b"\0" * 1024)
        for path in (run / "snapshot.bin", run):  # what the run last wrote, a month ago
            os.utime(path, (month_ago, month_ago))
    job = small_job(**{"name": "keep2", "parallelism.nnodes": 2, "training.steps": 4,
                       "checkpoint.memory_every_steps": 2, "cluster.namespace": NS,
                       "cluster.local_queue": "no-such-queue"})
    rendered = render_segment(SegmentLaunch(job, end_step=4), KubernetesTarget(
        store_uri="s3://unused/fm", shared_volume_claim=prepare_namespace(kube, NS)[0]))
    client = JobSetClient.from_kubeconfig(cluster.kubeconfig)
    client.submit(rendered)
    path = f"/apis/apps/v1/namespaces/{NS}/daemonsets/{KEEPER_NAME}"
    try:
        deadline = time.monotonic() + 120
        while (kube.get(path).get("status") or {}).get("numberReady") != len(cluster.nodes):
            assert time.monotonic() < deadline, kube.get(path).get("status")
            time.sleep(0.5)
        pods = kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=(
            "app.kubernetes.io/component=fast-tier-keeper"))["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(cluster.nodes)
        assert {p["status"]["phase"] for p in pods} == {"Running"}
        while any(run.exists() for run in stale.values()):  # its first sweep, at its start
            assert time.monotonic() < deadline, "the keeper left a month-old snapshot"
            time.sleep(0.5)
        assert not kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=(
            f"jobset.sigs.k8s.io/jobset-name={rendered.name}"))["items"]  # still queued
        client.delete(rendered.name, NS)
        assert kube.get_or_none(path) is not None  # shared by the namespace's jobs: it stays
    finally:
        client.delete(rendered.name, NS)
        kube.delete(path)
