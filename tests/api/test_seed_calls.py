"""The seed's three calls with the seed's bodies: submit, read status, resume."""

from __future__ import annotations

from fm_pipeline.config import dump_job
from tests.api.conftest import auth
from tests.api.progress_files import write_checkpoint, write_step_metrics


def test_submit_status_resume(client, plane, tokens, seed_body):
    prod = auth(tokens["prod"])
    orch = plane.orchestrator

    # 1. POST /v1/training/jobs -> 201 {job_id, status: "queued"}
    r = client.post("/v1/training/jobs", json=seed_body, headers=prod)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    assert r.json() == {"job_id": job_id, "status": "queued"}
    # The pool had room: the policy admitted it and the orchestrator started a run.
    assert orch.calls == [("submit", job_id, None)]
    spec = dump_job(plane.job_spec(job_id))  # the registry's copy: the queue keeps its digest
    assert {k: spec["parallelism"][k] for k in ("tp", "pp", "dp_shard", "nnodes", "nproc_per_node")
            } == {"tp": 4, "pp": 2, "dp_shard": 2, "nnodes": 2, "nproc_per_node": 8}
    assert spec["model"]["size"] == "llama3-8b" and spec["checkpoint"]["every_steps"] == 500
    assert spec["tenant"] == "prod" and spec["priority"] == "high"

    # The job trains: it writes metrics and commits a checkpoint; an hour passes.
    write_checkpoint(job_id, step=500)
    write_step_metrics(job_id, steps=range(1, 521), step_time_s=6.0, mfu=0.41)
    plane.clock.now += 3600

    # 2. GET /v1/training/jobs/{id} -> status from the run and the job's own files
    r = client.get(f"/v1/training/jobs/{job_id}", headers=prod)
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["status"] == "running" and status["queue_position"] is None
    assert status["step"] == 520 and status["mfu"] == 0.41
    assert status["step_time_ms"] == 6000.0 and status["tokens_per_s"] > 0
    assert status["last_ckpt"].endswith("checkpoints/step-00000500")
    assert status["last_ckpt_step"] == 500
    assert status["gpu_hours"] == 16.0  # 16 GPUs for one hour
    # At the pool's price: its cluster names no price, so the CPU's catalog one.
    from fm_pipeline.accelerators import CPU_DOLLARS_PER_HOUR
    assert status["cost_usd"] == round(16.0 * CPU_DOLLARS_PER_HOUR, 4)
    assert status["goodput"] == round(520 * 6.0 / 3600, 6)
    assert status["failure_reason"] is None

    # 3. POST /v1/training/jobs/{id}/resume {checkpoint} -> 202 {status: "restarting"}
    r = client.post(f"/v1/training/jobs/{job_id}/resume",
                    json={"checkpoint": "step-00000500"}, headers=prod)
    assert r.status_code == 202, r.text
    assert r.json() == {"job_id": job_id, "status": "restarting"}
    assert orch.calls[-1] == ("preempt", job_id, None)  # the running run checkpoints and stops
    assert client.get(f"/v1/training/jobs/{job_id}", headers=prod).json()["status"] == "restarting"
    orch.end(job_id, "preempted", "SIGTERM: checkpointed at step 521")
    plane.reconcile()
    assert orch.calls[-1] == ("resume", job_id, status["last_ckpt"])
    assert client.get(f"/v1/training/jobs/{job_id}", headers=prod).json()["status"] == "running"


def test_resume_without_a_body_restarts_a_failed_job_from_the_latest_checkpoint(
    client, plane, tokens, seed_body
):
    prod = auth(tokens["prod"])
    job_id = client.post("/v1/training/jobs", json=seed_body, headers=prod).json()["job_id"]
    plane.clock.now += 600
    plane.orchestrator.end(job_id, "failed", "rank 3: CUDA error: an illegal memory access")
    plane.reconcile()
    plane.clock.now += 60
    status = client.get(f"/v1/training/jobs/{job_id}", headers=prod).json()
    assert status["status"] == "failed"
    assert status["failure_reason"] == "rank 3: CUDA error: an illegal memory access"

    r = client.post(f"/v1/training/jobs/{job_id}/resume", headers=prod)
    assert r.status_code == 202 and r.json()["status"] == "restarting"
    assert plane.orchestrator.calls[-1] == ("resume", job_id, None)
    kinds = [e["kind"] for e in client.get(f"/v1/training/jobs/{job_id}/events",
                                           headers=prod).json()["events"]]
    assert kinds == ["submitted", "admitted", "run_started", "run_failed", "resume_requested",
                     "admitted", "run_started"]


def test_an_moe_jobs_status_carries_its_routing_and_a_dense_ones_none(client, tokens, seed_body):
    from tests.api.progress_files import write_step_metrics

    prod = auth(tokens["prod"])
    dense = client.post("/v1/training/jobs", json=seed_body, headers=prod).json()["job_id"]
    write_step_metrics(dense, steps=range(1, 3), step_time_s=1.0, mfu=0.3)
    assert client.get(f"/v1/training/jobs/{dense}", headers=prod).json()["router"] is None
    moe = client.post("/v1/training/jobs", json={**seed_body, "model": "moe-tiny"},
                      headers=prod)
    assert moe.status_code == 422 and "with a Mixture of Experts" in moe.text  # tp 4, pp 2
    body = {**seed_body, "model": "moe-tiny", "gpus": 8, "gpus_per_node": 8,
            "parallelism": {"tp": 1, "pp": 1, "dp": 8}}
    job = client.post("/v1/training/jobs", json=body, headers=prod).json()["job_id"]
    write_step_metrics(job, steps=range(1, 3), step_time_s=1.0, mfu=0.3, moe_max_load=1.25,
                       moe_dropped_slots=3, moe_slots=4096)
    status = client.get(f"/v1/training/jobs/{job}", headers=prod).json()
    assert status["router"] == {"max_load": 1.25, "dropped_slots": 3, "slots": 4096}


def test_a_retried_submit_with_an_idempotency_key_makes_one_job(client, plane, tokens,
                                                                 seed_body):
    # A client whose response was lost retries: the same key and body answer with the job
    # the first call made, not a second one; the same key for another body is refused.
    headers = {**auth(tokens["prod"]), "Idempotency-Key": "train-2026-12-06-a"}
    first = client.post("/v1/training/jobs", json=seed_body, headers=headers)
    again = client.post("/v1/training/jobs", json=seed_body, headers=headers)
    assert first.status_code == again.status_code == 201, again.text
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(plane.store.list()) == 1
    assert [c[0] for c in plane.orchestrator.calls] == ["submit"]

    other = client.post("/v1/training/jobs", json={**seed_body, "priority": "low"},
                        headers=headers)
    assert other.status_code == 409 and "used for another body" in other.json()["detail"]
    # Keys are per tenant, and without a key every call is a new job.
    research = {**auth(tokens["research"]), "Idempotency-Key": "train-2026-12-06-a"}
    assert client.post("/v1/training/jobs", json={**seed_body, "priority": "normal"},
                       headers=research).status_code == 201
    assert client.post("/v1/training/jobs", json=seed_body,
                       headers=auth(tokens["prod"])).json()["job_id"] != first.json()["job_id"]
    assert len(plane.store.list()) == 3
    # A day later the key names nothing any more.
    plane.clock.now += 24 * 3600 + 1
    late = client.post("/v1/training/jobs", json=seed_body, headers=headers)
    assert late.status_code == 201 and late.json()["job_id"] != first.json()["job_id"]
