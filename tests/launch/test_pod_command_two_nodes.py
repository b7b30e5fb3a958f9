"""The JobSet's pod command, with the env a pod gets, run as 2 "nodes" on loopback.

Two torchrun agents, one rank each, different node ranks, c10d rendezvous on 127.0.0.1
from the PET_* variables, exactly the command and env in the rendered manifest.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.pod_local import expand_k8s_vars, pod_process
from fm_pipeline.launch.spec import SegmentLaunch
from tests.conftest import REPO, free_port
from tests.launch.conftest import TINY_WORKER, tiny_job


def test_k8s_variable_expansion_follows_the_kubelet():
    env = {"PET_MASTER_ADDR": "leader", "PET_MASTER_PORT": "29500"}
    assert expand_k8s_vars("$(PET_MASTER_ADDR):$(PET_MASTER_PORT)", env) == "leader:29500"
    assert expand_k8s_vars("$$(PET_MASTER_ADDR) $(UNSET)", env) == "$(PET_MASTER_ADDR) $(UNSET)"


def _run_nodes(rendered, tmp_path, *, timeout_s: float = 180) -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    nodes = [
        pod_process(rendered, node_rank=rank, root=tmp_path / "pods",
                    hosts={rendered.leader_host: "127.0.0.1"},
                    env_overrides={"PET_MASTER_PORT": port})
        for rank in range(2)
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
def test_two_nodes_rendezvous_from_the_pod_env_and_all_reduce(tmp_path):
    job = tiny_job(nnodes=2, nproc=1)
    out = tmp_path / "out"
    out.mkdir()
    target = KubernetesTarget(store_uri="s3://fm-bucket/fm",
                              extra_env={"FM_TINY_WORKER": "all_reduce", "FM_TINY_OUT": str(out)})
    rendered = render_segment(SegmentLaunch(job, end_step=5, module=TINY_WORKER), target)
    finished = _run_nodes(rendered, tmp_path)
    for node in finished:
        assert node.returncode == 0, node.stdout[-3000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in reports] == [2, 2]
    assert [r["sum"] for r in reports] == [3.0, 3.0]  # 1 + 2: both nodes joined one group
    # The job spec came through the emulated ConfigMap mount; the store through the env.
    assert reports[0]["job"].endswith("job-spec/job.yaml") and reports[0]["end_step"] == 5
    assert reports[1]["store"] == "s3://fm-bucket/fm"
