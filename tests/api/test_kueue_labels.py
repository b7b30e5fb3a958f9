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


def test_status_says_queued_while_kueue_holds_the_segment_and_counts_its_evictions(
        client, plane, tokens, seed_body):
    from fm_pipeline.launch.k8s_follow import JobSetStatus
    from fm_pipeline.launch.k8s_kueue_events import KueueEventLog

    prod = auth(tokens["prod"])
    job_id = client.post("/v1/training/jobs", json=seed_body, headers=prod).json()["job_id"]

    def status() -> dict:
        return client.get(f"/v1/training/jobs/{job_id}", headers=prod).json()

    assert status()["status"] == "running" and status()["queued_by"] is None
    # What the Kubernetes launcher's follow sees, as JobSetClient.follow reports it.
    evicted = {"reason": "Preempted", "message": "Preempted to accommodate a workload "
               "(UID: 1) due to reclamation within the cohort", "evicted_at": 1.0}
    log = KueueEventLog(plane.site.runs_dir(job_id), f"{job_id}-500", eviction=lambda: evicted)
    queued = JobSetStatus("x", "Suspended", message="queued, not admitted by Kueue: "
                          "couldn't assign flavors to pod set node: insufficient quota")
    log(queued)
    log(queued)  # every poll sees it: one event
    assert status()["status"] == "queued"
    assert status()["queued_by"].startswith(f"queued in Kueue (JobSet {job_id}-500): queued, "
                                            "not admitted by Kueue: couldn't assign flavors")
    log(JobSetStatus("x", "Pending"))
    log(JobSetStatus("x", "Running"))
    assert status()["status"] == "running" and status()["preemptions"] == 0
    log(JobSetStatus("x", "Suspended", message="suspended after admission"))
    after = status()
    assert after["status"] == "queued" and after["preemptions"] == 1
    assert "evicted by Kueue" in after["queued_by"] and "reclamation" in after["queued_by"]
    kinds = [e["kind"] for e in client.get(f"/v1/training/jobs/{job_id}/events",
                                           headers=prod).json()["events"]]
    assert [k for k in kinds if k.startswith("kueue_")] == [
        "kueue_queued", "kueue_admitted", "kueue_evicted"]
