"""What the real apiserver, JobSet and Kueue refuse, and `fm k8s render`'s own validation
agreeing with them on a corpus of mutated manifests; what they do with a segment that
cannot run as asked: a missing LocalQueue, an excluded host under topology-aware
scheduling, a failure past the restart budget.

The cluster's verdict on a JobSet is two questions, both asked of the real apiserver with
`dryRun=All` (admission webhooks included) and strict field validation: is the JobSet
accepted, and could the Job controller make a pod from its template (a CRD schema does not
require a container's image; the pod create then fails and the segment never runs)."""

from __future__ import annotations

import copy
import time

import pytest

from fm_pipeline.data.testing import small_job
from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_client import JobSetClient
from fm_pipeline.launch.k8s_validate import ManifestInvalid, validate_all
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.devcluster.rest import ApiError

NS = "prod"


def _rendered(name: str = "refuse", queue: str = "prod"):
    job = small_job(**{"name": name, "parallelism.nnodes": 2,
                       "parallelism.nproc_per_node": 2, "cluster.namespace": NS,
                       "cluster.local_queue": queue})
    return render_segment(SegmentLaunch(job, end_step=4), KubernetesTarget(store_uri="s3://b/fm"))


def _pod_spec(obj: dict) -> dict:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _container(obj: dict) -> dict:
    return _pod_spec(obj)["containers"][0]


def _set(path_fn, key, value):
    return lambda o: path_fn(o).__setitem__(key, value)


MUTATIONS = {
    "as rendered": lambda o: None,
    "unknown field in spec": _set(lambda o: o["spec"], "bogus", 1),
    "unknown field in the pod template": _set(_pod_spec, "bogus", 1),
    "unknown field in a container": _set(_container, "imagePullPolicyy", "Always"),
    "container without an image": lambda o: _container(o).pop("image"),
    "container with an empty image": _set(_container, "image", ""),
    "env var without a name": lambda o: _container(o)["env"].append({"value": "x"}),
    "unknown restartPolicy": _set(_pod_spec, "restartPolicy", "Sometimes"),
    "cpu request that is no quantity": lambda o: _container(o)["resources"].__setitem__(
        "requests", {"cpu": "lots"}),
    "uppercase name": _set(lambda o: o["metadata"], "name", "Refuse"),
    "label value too long": lambda o: o["metadata"]["labels"].__setitem__("team", "x" * 64),
    "bad label key": lambda o: o["metadata"]["labels"].__setitem__("-bad", "x"),
    "maxRestarts -5": lambda o: o["spec"].setdefault("failurePolicy", {}).__setitem__(
        "maxRestarts", -5),
    "replicas as a string": _set(lambda o: o["spec"]["replicatedJobs"][0], "replicas", "two"),
    "negative grace period": _set(_pod_spec, "terminationGracePeriodSeconds", -1),
}


def _cluster_verdict(kube, obj: dict) -> tuple[bool, str]:
    try:
        kube.request("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets",
                     body=obj, params={"dryRun": "All", "fieldValidation": "Strict"})
        template = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "probe-", "namespace": NS,
                         "labels": template["metadata"].get("labels", {})},
            "spec": template["spec"]}, params={"dryRun": "All", "fieldValidation": "Strict"})
        return True, ""
    except ApiError as e:
        assert 400 <= e.status < 500, e  # a refusal, not a broken cluster
        return False, str(e)


def _our_verdict(obj: dict) -> tuple[bool, str]:
    try:
        validate_all([obj])
        return True, ""
    except ManifestInvalid as e:
        return False, str(e)


def test_render_validation_agrees_with_the_real_cluster_on_every_mutation(kube):
    base = _rendered().jobset
    verdicts = {}
    for name, mutate in MUTATIONS.items():
        obj = copy.deepcopy(base)
        mutate(obj)
        verdicts[name] = (_cluster_verdict(kube, obj), _our_verdict(obj))
    disagree = {name: (real, ours) for name, (real, ours) in verdicts.items()
                if real[0] != ours[0]}
    assert not disagree, disagree
    # What the double accepted and the real cluster refuses ...
    for refused in ("unknown field in spec", "container without an image",
                    "unknown restartPolicy", "env var without a name"):
        assert verdicts[refused][0][0] is False, refused
    assert "strict decoding error" in verdicts["unknown field in spec"][0][1]
    assert "image: Required value" in verdicts["container without an image"][0][1]
    # ... and what the real JobSet v0.12 accepts although the double's schema check did
    # not: its CRD sets no minimum on maxRestarts (the manifests never render one).
    assert verdicts["maxRestarts -5"][0][0] is True
    assert verdicts["as rendered"][0][0] is True


def test_a_local_queue_that_does_not_exist_stays_unadmitted_and_is_reported(kube, cluster):
    rendered = _rendered("noqueue", queue="no-such-queue")
    client = JobSetClient.from_kubeconfig(cluster.kubeconfig)
    client.submit(rendered)
    try:
        statuses = []
        from fm_pipeline.launch.k8s_client import SegmentTimeout

        with pytest.raises(SegmentTimeout, match="LocalQueue no-such-queue doesn't exist"):
            client.follow(rendered.name, NS, poll_s=0.5, timeout_s=8,
                          on_status=statuses.append)
        assert statuses and statuses[-1].phase == "Suspended"
        assert "not admitted by Kueue: LocalQueue no-such-queue doesn't exist" in \
            statuses[-1].message
        assert not client.pods(rendered.name, NS)  # nothing ran
        jobset = client.get(rendered.name, NS)
        assert jobset["spec"]["suspend"] is True
    finally:
        _gone(client, rendered.name)


def _placed(name: str, *, nnodes: int, avoid: str):
    """A segment of `nnodes` pods of 5 ranks (5 CPUs each: two never share one of the dev
    cluster's 8-CPU nodes) kept within one topology block (Kueue TAS) and off the node
    `avoid` (Placement.avoid_hosts: what plan_after_stragglers gives on Kubernetes)."""
    from fm_pipeline.launch.pod import Placement

    job = small_job(**{"name": name, "parallelism.nnodes": nnodes,
                       "parallelism.nproc_per_node": 5, "training.global_batch_size": 10,
                       "training.micro_batch_size": 1, "cluster.namespace": NS,
                       "cluster.local_queue": "prod"})
    placement = Placement(required_topology="cloud.provider.com/topology-block",
                          avoid_hosts=(avoid,))
    return render_segment(SegmentLaunch(job, end_step=4),
                          KubernetesTarget(store_uri="s3://b/fm", placement=placement))


def _gone(client: JobSetClient, name: str) -> None:
    client.delete(name, NS)
    deadline = time.monotonic() + 30
    while client.get(name, NS) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get(name, NS) is None


def test_topology_aware_admission_leaves_an_excluded_host_out(kube, cluster):
    """The real Kueue's topology-aware scheduling reads the excluded host from the PodSet's
    required node affinity: a one-node segment kept off node-0 is admitted onto node-1; a
    two-node segment kept off node-1 (two 8-CPU nodes, 5 CPUs a pod) stays queued, with
    Kueue's reason, instead of landing on the excluded host."""
    from fm_pipeline.launch.k8s_client import SegmentTimeout

    client = JobSetClient.from_kubeconfig(cluster.kubeconfig)
    fits = _placed("tas-fit", nnodes=1, avoid="node-0")
    client.submit(fits)
    try:
        deadline = time.monotonic() + 60
        while True:
            bound = [p for p in client.pods(fits.name, NS) if p.spec.node_name]
            if bound or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert [p.spec.node_name for p in bound] == ["node-1"]
    finally:
        _gone(client, fits.name)

    too_few = _placed("tas-nofit", nnodes=2, avoid="node-1")
    client.submit(too_few)
    try:
        statuses = []
        with pytest.raises(SegmentTimeout) as timeout:
            client.follow(too_few.name, NS, poll_s=0.5, timeout_s=10,
                          on_status=statuses.append)
        assert statuses and statuses[-1].phase == "Suspended"
        # Kueue's own words, through the follower: the exclusion, not the quota, left it out.
        assert 'topology "fm-topology" allows to fit only 1 out of 2 pod(s)' in str(timeout.value)
        assert "excluded: affinity: 1" in statuses[-1].message
        assert not client.pods(too_few.name, NS)  # nothing ran, on node-1 or anywhere
    finally:
        _gone(client, too_few.name)


def test_an_ordinary_failure_past_the_restart_budget_fails_the_jobset(kube, cluster,
                                                                      s3_endpoint, s3_bucket):
    """A worker that fails (its data mix is not in the store: the trainer exits 2, torchrun
    the container with 1) fails its node's Job (backoffLimit 0); the real JobSet controller
    restarts the JobSet once (max_restarts 1, counted against it), then fails it at the
    budget; the follower reports that, and the worker's own error from each attempt."""
    from tests.devcluster.objects import prepare_namespace

    _, secret = prepare_namespace(kube, NS)
    job = small_job(**{"name": "budget", "parallelism.nnodes": 2,
                       "parallelism.nproc_per_node": 1, "cluster.namespace": NS,
                       "cluster.local_queue": "prod"})
    rendered = render_segment(SegmentLaunch(job, end_step=4), KubernetesTarget(
        store_uri=f"s3://{s3_bucket}/fm", s3_endpoint_url=s3_endpoint,
        credentials_secret=secret, max_restarts=1))
    client = JobSetClient.from_kubeconfig(cluster.kubeconfig)
    client.submit(rendered)
    try:
        followed = client.follow(rendered.name, NS, poll_s=0.5, timeout_s=240)
        assert followed.status.phase == "Failed" and followed.status.restarts == 1
        assert "reaching max number of restarts" in followed.status.message
        # Each attempt's pods failed (the controller deletes them at the restart; the
        # follower's pod watch kept them), with the worker's own code and error.
        assert {f.restart_attempt for f in followed.failures} == {0, 1}
        for failure in followed.failures:
            assert failure.container_exit_code == 1 and failure.evidence.exit_code == 2
            assert "DataError: data mix" in failure.evidence.reason
        assert followed.root_failure().restart_attempt == 1
    finally:
        _gone(client, rendered.name)
