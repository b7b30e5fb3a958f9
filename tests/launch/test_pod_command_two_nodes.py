"""The JobSet's pod command, with the env a pod gets, run as 2 "nodes" on loopback.

Two torchrun agents, one rank each, different completion indexes, c10d rendezvous on
127.0.0.1 from the PET_* variables: exactly the command and env of the rendered manifest
(pod_local plays the kubelet and the cluster DNS).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.pod_local import expand_k8s_vars, pod_process
from fm_pipeline.launch.spec import SegmentLaunch
from tests.conftest import REPO, free_port
from tests import local_site


def test_k8s_variable_expansion_follows_the_kubelet():
    env = {"PET_MASTER_ADDR": "leader", "PET_MASTER_PORT": "29500"}
    assert expand_k8s_vars("$(PET_MASTER_ADDR):$(PET_MASTER_PORT)", env) == "leader:29500"
    assert expand_k8s_vars("$$(PET_MASTER_ADDR) $(UNSET)", env) == "$(PET_MASTER_ADDR) $(UNSET)"


def _run_nodes(rendered, tmp_path, *, timeout_s: float = 180,
               nodes: int = 2) -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    overrides = {"PET_MASTER_PORT": port, **({"PET_NNODES": str(nodes)} if nodes != 2 else {})}
    nodes = [
        pod_process(rendered, node_rank=rank, root=tmp_path / "pods",
                    hosts={rendered.leader_host: "127.0.0.1"}, env_overrides=overrides)
        for rank in range(nodes)
    ]
    procs = [subprocess.Popen(n.argv, env=n.env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for n in nodes]
    try:
        outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [subprocess.CompletedProcess(n.argv, p.returncode, out)
            for n, p, out in zip(nodes, procs, outputs)]


@pytest.mark.slow
def test_two_nodes_train_and_checkpoint_with_the_pod_command(tmp_path, s3_bucket, s3_endpoint):
    """The real trainer: 2 nodes x 1 rank train 4 steps from a data mix in S3 (a moto server
    on loopback), commit a checkpoint on the shared claim and upload it to the store."""
    store_uri = f"s3://{s3_bucket}/fm"
    job = small_job(**{"name": "two", "parallelism.nnodes": 2, "parallelism.nproc_per_node": 1,
                       "training.steps": 8, "training.segment_steps": 4,
                       "checkpoint.every_steps": 100})
    build_small_mix(job, store=local_site.site().open_store(store_uri))
    target = KubernetesTarget(store_uri=store_uri, s3_endpoint_url=s3_endpoint,
                              shared_volume_claim="fm-runs")
    rendered = render_segment(SegmentLaunch(job, end_step=4), target)
    finished = _run_nodes(rendered, tmp_path)
    for node in finished:
        assert node.returncode == 0, node.stdout[-4000:]
    logs = "".join(node.stdout for node in finished)
    assert "completed at step 4" in logs
    manifest = json.loads(local_site.site().open_store(store_uri).get_bytes(
        "checkpoints/two/step-00000004/manifest.json"))
    assert manifest["step"] == 4
    assert manifest["parallelism"]["world_size"] == 2 and manifest["parallelism"]["nnodes"] == 2

    # The next segment on one node (the other is gone): the rendered spec still declares
    # dp_shard -1, so the trainer follows the smaller world and reshards the checkpoint.
    assert "dp_shard: -1" in rendered.config_map["data"]["job.yaml"]
    following = render_segment(SegmentLaunch(job, end_step=8), target)
    (alone,) = _run_nodes(following, tmp_path, nodes=1)
    assert alone.returncode == 0, alone.stdout[-4000:]
    assert "completed at step 8" in alone.stdout
    manifest = json.loads(local_site.site().open_store(store_uri).get_bytes(
        "checkpoints/two/step-00000008/manifest.json"))
    assert manifest["parallelism"]["world_size"] == 1 and manifest["parallelism"]["dp_shard"] == 1
    restored = [line for line in alone.stdout.splitlines() if "restored step 4" in line]
    assert restored, alone.stdout[-3000:]
