"""JobSetClient against a kube-apiserver TEST DOUBLE on 127.0.0.1 (see kube_api_double.py):
submit, follow through a JobSet restart (re-attaching to the new leader pod), the real
failure reason from termination messages, delete on cancel."""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client as k8s

from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_client import JobSetClient, JobSetExists
from fm_pipeline.launch.k8s_follow import segment_result
from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.launch.spec import SegmentLaunch
from tests.launch.conftest import tiny_job
from tests import local_site

NS = "training"

# What a failed pod's termination message holds (FallbackToLogsOnError: the log tail):
# torchrun's summary, here cut so that its header is gone.
SUMMARY_TAIL = """\
  File "/usr/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
[0]:
  time      : 2026-11-29_14:34:54
  host      : tiny-20-node-0-1
  rank      : 1 (local_rank: 0)
  exitcode  : 75 (pid: 8036)
  error_file: /var/lib/fm/torchrun/x/attempt_0/0/error.json
  traceback : preempted (signal SIGTERM) at step 17; checkpoint step-00000017
============================================================
"""


@pytest.fixture
def jobsets(api) -> JobSetClient:
    return JobSetClient(k8s.ApiClient(k8s.Configuration(host=api.url)))


@pytest.fixture
def rendered():
    job = tiny_job(nnodes=2, nproc=1, cluster={"namespace": NS})
    return render_segment(SegmentLaunch(job, end_step=20),
                          KubernetesTarget(store_uri="s3://fm-bucket/fm",
                                           shared_volume_claim="fm-runs"))


def _start_pods(api, name: str, attempt: int) -> list[str]:
    """The kubelet starts the two pods the Job controller made for this attempt."""
    pods = api.wait_for_pods(NS, name, 2, attempt=attempt)
    for pod in pods:
        api.start_pod(NS, pod)
    return pods


def test_submit_creates_owned_objects_with_strict_field_validation(api, jobsets, rendered):
    """The client creates the JobSet and its ConfigMap; the headless Service is the JobSet
    controller's (the double creates it as the controller does, at once): the client never
    races it (it used to create one of the same name after the JobSet: a 409, after which
    it deleted the JobSet it had just created)."""
    jobset = jobsets.submit(rendered)
    assert (NS, rendered.name) in api.jobsets
    owner = api.core[("configmaps", NS, f"{rendered.name}-job")]["metadata"][
        "ownerReferences"][0]
    assert owner["uid"] == jobset["metadata"]["uid"] and owner["kind"] == "JobSet"
    service = api.core[("services", NS, rendered.name)]
    (controller,) = service["metadata"]["ownerReferences"]
    assert controller["uid"] == jobset["metadata"]["uid"] and controller["controller"] is True
    assert service["spec"]["publishNotReadyAddresses"] is True
    creates = [(p, q) for method, p, q in api.requests if method == "POST"]
    assert len(creates) == 2 and all(q["fieldValidation"] == ["Strict"] for _, q in creates)
    assert not any("/services" in p for p, _ in creates)
    with pytest.raises(JobSetExists, match="already exists in namespace 'training'"):
        jobsets.submit(rendered)
    assert jobsets.status(rendered.name, NS).phase == "Pending"
    assert jobsets.delete(rendered.name, NS) is True
    assert not api.jobsets and not api.core
    assert jobsets.status(rendered.name, NS).phase == "Deleted"


def test_submit_creates_the_fast_tier_keeper_once_per_namespace(api, jobsets):
    """Every job of a namespace that uses the fast tier shares one node keeper: the first
    submit creates it, later ones leave it, and deleting a JobSet leaves it running."""
    def render(name):
        job = tiny_job(name=name, nnodes=2, nproc=1, cluster={"namespace": NS},
                       checkpoint={"memory_every_steps": 2})
        return render_segment(SegmentLaunch(job, end_step=20),
                              KubernetesTarget(store_uri="s3://fm-bucket/fm",
                                               shared_volume_claim="fm-runs"))

    first, second = render("one"), render("two")
    jobsets.submit(first)
    jobsets.submit(second)
    keepers = [(m, p) for m, p, _ in api.requests if p.endswith("/daemonsets")]
    assert keepers == [("POST", f"/apis/apps/v1/namespaces/{NS}/daemonsets")] * 2
    assert ("daemonsets", NS, first.keeper["metadata"]["name"]) in api.core
    jobsets.delete(first.name, NS)
    assert ("daemonsets", NS, first.keeper["metadata"]["name"]) in api.core


def test_follow_reattaches_to_the_new_leader_after_a_restart(api, jobsets, rendered):
    name = rendered.name

    def kubelet():  # the controllers make the pods; the test runs them
        first = _start_pods(api, name, attempt=0)
        api.wait_for_log_reader(NS, first[0])
        api.log(NS, first[0], "step 1 loss 10.4\nstep 2 loss 9.8")
        # Node 1 fails: its Job fails (backoffLimit 0), the Job controller deletes node 0's
        # pod, the JobSet's failure policy restarts everything (restart-attempt 1).
        api.terminate_pod(NS, first[1], exit_code=1, message=SUMMARY_TAIL)
        second = _start_pods(api, name, attempt=1)
        api.wait_for_log_reader(NS, second[0])
        api.log(NS, second[0], "resumed from step-00000017\nstep 20 loss 7.1")
        for pod in second:
            api.terminate_pod(NS, pod, exit_code=0)
        pods[:] = first + second

    pods: list[str] = []
    seen: dict[str, list[str]] = {}

    def read_leader(pod: str):
        seen[pod] = list(jobsets.log_lines(pod, NS))

    jobsets.submit(rendered)
    thread = threading.Thread(target=kubelet, daemon=True)
    thread.start()
    followed = jobsets.follow(name, NS, on_leader_pod=read_leader, poll_s=0.05, timeout_s=60)
    thread.join(timeout=10)
    assert followed.status.phase == "Completed" and followed.status.restarts == 1
    first_leader, _, second_leader, _ = pods
    assert followed.leader_pods == [first_leader, second_leader]
    assert seen[first_leader] == ["step 1 loss 10.4", "step 2 loss 9.8"]
    assert seen[second_leader] == ["resumed from step-00000017", "step 20 loss 7.1"]
    # The restart's cause outlived its deleted pods: the worker's own code and reason,
    # not torchrun's 1.
    cause = next(f for f in followed.failures if f.pod == pods[1])
    assert cause.container_exit_code == 1 and cause.evidence.exit_code == 75
    assert cause.evidence.rank == 1 and "preempted" in cause.evidence.reason
    result = segment_result(followed, SegmentLaunch(tiny_job(nnodes=2, nproc=1), end_step=20))
    assert result.outcome is Outcome.SUCCEEDED and "1 JobSet restart" in result.reason


def test_a_failed_jobset_reports_the_workers_code_and_reason(api, jobsets):
    job = tiny_job(nnodes=2, nproc=1, cluster={"namespace": NS})
    rendered = render_segment(SegmentLaunch(job, end_step=20), KubernetesTarget(
        store_uri="s3://fm-bucket/fm", shared_volume_claim="fm-runs", max_restarts=0))
    name = rendered.name
    pods: list[str] = []

    def kubelet():
        pods[:] = _start_pods(api, name, attempt=0)
        api.wait_for_pod_watch(NS)  # the follower watches before the pods end, as in life
        api.terminate_pod(NS, pods[0], exit_code=1, message=SUMMARY_TAIL.replace(
            "exitcode  : 75", "exitcode  : 2").replace(
            "preempted (signal SIGTERM) at step 17; checkpoint step-00000017",
            "JobSpecError: data mix 3f2a not found in s3://fm-bucket/fm"))

    jobsets.submit(rendered)
    threading.Thread(target=kubelet, daemon=True).start()
    followed = jobsets.follow(name, NS, poll_s=0.05, timeout_s=60)
    # No restart left: the JobSet controller fails the JobSet (ReachedMaxRestarts).
    assert followed.status.phase == "Failed" and "max number of restarts" in \
        followed.status.message
    by_pod = {f.pod: f for f in followed.failures}
    # The Job controller stopped the other node once the first failed: only k8s knows why.
    assert by_pod[pods[1]].evidence.exit_code == 143
    # The first pod to fail is the cause; the other node's death came after.
    result = segment_result(followed, SegmentLaunch(tiny_job(nnodes=2, nproc=1), end_step=20))
    assert result.outcome is Outcome.BAD_CONFIG and result.exit_code == 2
    assert result.torchrun_exit_code == 1 and result.failed_rank == 1
    assert "data mix 3f2a not found" in result.reason


def test_cancelling_while_following_deletes_the_jobset(api, jobsets, rendered):
    name = rendered.name

    def kubelet():
        _start_pods(api, name, attempt=0)

    def cancelled(pod: str):
        raise KeyboardInterrupt  # what a cancelled run looks like to the follower

    jobsets.submit(rendered)
    threading.Thread(target=kubelet, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        try:
            jobsets.follow(name, NS, on_leader_pod=cancelled, poll_s=0.05, timeout_s=60)
        finally:
            jobsets.delete(name, NS)
    assert (NS, name) not in api.jobsets and not api.pods and not api.core
    deletes = [path for method, path, _ in api.requests if method == "DELETE"]
    assert any(path.endswith(f"/jobsets/{name}") for path in deletes)


def test_a_jobset_stopped_while_queued_ends_preempted_with_nothing_to_save(
        api, jobsets, rendered):
    from fm_pipeline.launch.k8s_stop import followed_jobset, stop_jobsets

    api.admission = None  # Kueue has not admitted it: it waits, suspended
    name = rendered.name
    jobsets.submit(rendered)
    assert jobsets.status(name, NS).phase == "Suspended"
    with followed_jobset(local_site.runs_dir("tiny"), rendered) as record:
        assert stop_jobsets(jobsets, local_site.runs_dir("tiny"), reason="cancel") == [name]
        assert stop_jobsets(jobsets, local_site.runs_dir("tiny"), reason="cancel") == []  # once
        followed = jobsets.follow(name, NS, poll_s=0.05, timeout_s=30)
        stopped = record.stop_reason()
    assert not record.path.exists() and followed.status.phase == "Deleted"
    ((_, options),) = api.delete_options
    assert options["propagationPolicy"] == "Foreground"
    assert options["gracePeriodSeconds"] == 40  # preemption_grace_s 25 + 15
    result = segment_result(followed, SegmentLaunch(tiny_job(nnodes=2, nproc=1), end_step=20),
                            stopped=stopped)
    assert result.outcome is Outcome.PREEMPTED and result.exit_code == 75
    assert "stopped on request (cancel)" in result.reason


def test_a_pod_watch_answered_410_gone_starts_again_from_the_current_pods(api, jobsets,
                                                                          rendered):
    """The API server compacts its history: a watch resuming from a resourceVersion it no
    longer has gets an ERROR event with a 410 Status. The watch lists the current pods and
    watches on from the list's version (once: not 410 again every window); a pod that fails
    after that is still recorded with its exit code."""
    from fm_pipeline.launch.k8s_follow import PodFailureWatch

    name = rendered.name
    jobsets.submit(rendered)
    pods = _start_pods(api, name, attempt=0)
    assert all(p["metadata"]["resourceVersion"] for p in api.pods.values())
    assert api.jobsets[(NS, name)]["metadata"]["resourceVersion"]
    def poll(what: str, predicate) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"never happened: {what}"
            time.sleep(0.05)

    watch = PodFailureWatch(jobsets, name, NS)
    watch.start()
    try:
        poll("a watch resuming", lambda: any(q.get("watch") and q.get("resourceVersion")
                                             for _, _, q in list(api.requests)))
        def pod_lists() -> int:
            return sum(1 for method, path, q in list(api.requests)
                       if method == "GET" and path.endswith("/pods") and not q.get("watch"))

        assert pod_lists() == 1  # listed once, then watched from the list's version
        api.compact()
        poll("a 410 Gone", lambda: api.gone_served >= 1)
        # A pod that fails after the watch has listed again: its event follows that list.
        poll("the pods listed again", lambda: pod_lists() == 2)
        api.terminate_pod(NS, pods[1], exit_code=137)
        poll("the failure recorded", lambda: any(f.pod == pods[1] for f in watch.failures()))
    finally:
        watch.stop()
    failure = next(f for f in watch.failures() if f.pod == pods[1])
    assert failure.container_exit_code == 137
    assert api.gone_served == 1 and pod_lists() == 2
