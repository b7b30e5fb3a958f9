"""A job submitted through the API renders as a JobSet that names its tenant's LocalQueue
and a WorkloadPriorityClass that the tenants config's Kueue objects define."""

from __future__ import annotations

from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.scheduling.kueue import render_kueue
from tests.api.conftest import auth


def test_submitted_job_carries_the_queue_and_priority_labels_kueue_knows(client, plane, tokens,
                                                                         seed_body):
    body = {**seed_body, "gpus": 8, "parallelism": {"tp": 4, "pp": 2, "dp": 1}}
    job_id = client.post("/v1/training/jobs", json=body,
                         headers=auth(tokens["prod"])).json()["job_id"]
    job = plane.job_spec(job_id)
    jobset = render_segment(SegmentLaunch(job, end_step=1),
                            KubernetesTarget(store_uri="s3://fm-bucket/fm")).jobset
    labels, namespace = jobset["metadata"]["labels"], jobset["metadata"]["namespace"]
    assert (labels["kueue.x-k8s.io/queue-name"], labels["kueue.x-k8s.io/priority-class"],
            namespace) == ("prod", "fm-high", "prod")

    kueue = render_kueue(plane.tenants)
    local_queues = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["clusterQueue"]
                    for o in kueue if o["kind"] == "LocalQueue"}
    assert local_queues[(namespace, labels["kueue.x-k8s.io/queue-name"])] == "prod"
    assert labels["kueue.x-k8s.io/priority-class"] in {
        o["metadata"]["name"] for o in kueue if o["kind"] == "WorkloadPriorityClass"}
