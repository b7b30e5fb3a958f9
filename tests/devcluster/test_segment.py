"""A training segment through `KubernetesLauncher` on the real controllers: Kueue admits
it within the ClusterQueue's quota, the JobSet controller makes the Job, pods and headless
Service, the scheduler places the pods, the ranks meet through PET_MASTER_ADDR, rank 0's
Pipes messages reach Dagster through the pod log the apiserver proxies, and the
checkpoint commits to the store."""

from __future__ import annotations

import json

import pytest
from dagster import asset, materialize
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher

from fm_pipeline.data.testing import build_small_mix, small_job
from tests import local_site

NS = "prod"


def _shared_claim(kube) -> str:
    """A ReadWriteMany claim bound by the real PV controller (the process kubelet mounts
    it as one folder every node sees)."""
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "fm-runs-prod"},
                "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"],
                         "hostPath": {"path": "/fm-runs"}, "storageClassName": "",
                         "claimRef": {"namespace": NS, "name": "fm-runs"}}})
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "fm-runs", "namespace": NS},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                         "volumeName": "fm-runs-prod",
                         "resources": {"requests": {"storage": "1Gi"}}}})
    return "fm-runs"


def _credentials(kube) -> str:
    kube.apply({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s3-credentials", "namespace": NS},
                "stringData": {"AWS_ACCESS_KEY_ID": "testing",
                               "AWS_SECRET_ACCESS_KEY": "testing",
                               "AWS_DEFAULT_REGION": "us-east-1"}})
    return "s3-credentials"


@pytest.mark.slow
def test_a_two_node_segment_runs_to_completion_on_the_real_controllers(
        cluster, kube, s3_bucket, s3_endpoint):
    store_uri = f"s3://{s3_bucket}/fm"
    job = small_job(**{"name": "kube2", "parallelism.nnodes": 2,
                       "parallelism.nproc_per_node": 2, "training.steps": 4,
                       "checkpoint.every_steps": 100, "cluster.namespace": NS,
                       "cluster.local_queue": "prod"})
    build_small_mix(job, store=local_site.site().open_store(store_uri))
    launcher = KubernetesLauncher(
        store_uri=store_uri, s3_endpoint_url=s3_endpoint, kubeconfig_file=cluster.kubeconfig,
        credentials_secret=_credentials(kube), shared_volume_claim=_shared_claim(kube),
        poll_interval_s=0.5, timeout_s=300, delete_on_completion=False)

    @asset(required_resource_keys={"launcher"})
    def segment(context):
        return context.resources.launcher.launch_segment(context, job=job,
                                                         end_step=4).materialize_result()

    result = materialize([segment], resources={"launcher": launcher})
    assert result.success
    (mat,) = result.asset_materializations_for_node("segment")
    assert mat.metadata["end_step"].value == 4  # rank 0's Pipes message, via pods/log
    assert mat.metadata["outcome"].value == "succeeded"

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
    manifest = json.loads(local_site.site().open_store(store_uri).get_bytes(
        "checkpoints/kube2/step-00000004/manifest.json"))
    assert manifest["step"] == 4
    assert manifest["parallelism"]["world_size"] == 4
    assert manifest["parallelism"]["nnodes"] == 2
    kube.delete(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets/{name}",
                propagation="Foreground")
