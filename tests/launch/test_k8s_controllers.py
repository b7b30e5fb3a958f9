"""What the emulated Kueue, JobSet and Job controllers (kube_controllers.py) still cover
until it moves to the real cluster (tests/devcluster, docs/kubernetes.md "How this is
tested"): a lost node restarting the JobSet without using its restart budget. An ordinary
failure past the budget and topology-aware admission leaving an excluded host out are the
real controllers' (tests/devcluster/test_refusals.py). A segment
queued, admitted, run and completed, and a Kueue preemption ending the follow evicted, are
tested on the real controllers (tests/devcluster/test_segment.py, test_preemption.py) and
no longer here. The test plays only the kubelet."""

from __future__ import annotations

import threading

import pytest
from kubernetes import client as k8s

from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_client import JobSetClient
from fm_pipeline.launch.spec import SegmentLaunch
from tests.launch.conftest import tiny_job

NS = "training"


@pytest.fixture
def jobsets(api) -> JobSetClient:
    return JobSetClient(k8s.ApiClient(k8s.Configuration(host=api.url)))


def _rendered(max_restarts: int = 3):
    job = tiny_job(nnodes=2, nproc=1, cluster={"namespace": NS})
    return render_segment(SegmentLaunch(job, end_step=20), KubernetesTarget(
        store_uri="s3://fm-bucket/fm", shared_volume_claim="fm-runs",
        max_restarts=max_restarts))


def _follow_in_background(jobsets, name, phases, leaders):
    def read(pod):
        leaders.append(pod)
        list(jobsets.log_lines(pod, NS))

    out = {}

    def run():
        out["followed"] = jobsets.follow(name, NS, on_leader_pod=read, poll_s=0.05,
                                         timeout_s=60,
                                         on_status=lambda s: phases.append(s.phase))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_lost_node_restarts_the_jobset_without_using_its_restart_budget(api, jobsets):
    """The rendered failure policy: a pod with DisruptionTarget (node lost, evicted) fails its
    Job by podFailurePolicy; the JobSet rule RestartJobSetAndIgnoreMaxRestarts matches that
    reason and message, so even with max_restarts 0 the JobSet restarts; the follower
    re-attaches to the new leader."""
    rendered = _rendered(max_restarts=0)
    name = rendered.name
    jobsets.submit(rendered)
    phases: list[str] = []
    leaders: list[str] = []
    thread, out = _follow_in_background(jobsets, name, phases, leaders)
    first = api.wait_for_pods(NS, name, 2, attempt=0)
    for pod in first:
        api.start_pod(NS, pod)
    api.wait_for_log_reader(NS, first[0])
    api.terminate_pod(NS, first[1], exit_code=137, disruption=True)
    (failed_job,) = [j for j in api.jobs.values()
                     if j["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "0"] \
        or [None]
    second = api.wait_for_pods(NS, name, 2, attempt=1)
    status = api.jobsets[(NS, name)]["status"]
    assert status["restarts"] == 1 and not status.get("restartsCountTowardsMax")
    assert failed_job is None  # BlockingRecreate: the old Job was gone before the new one
    for pod in second:
        api.start_pod(NS, pod)
    api.wait_for_log_reader(NS, second[0])
    for pod in second:
        api.terminate_pod(NS, pod, exit_code=0)
    thread.join(timeout=30)
    followed = out["followed"]
    assert followed.status.phase == "Completed" and followed.status.restarts == 1
    assert leaders == [first[0], second[0]]
    lost = next(f for f in followed.failures if f.pod == first[1])
    assert lost.container_exit_code == 137 and lost.restart_attempt == 0
