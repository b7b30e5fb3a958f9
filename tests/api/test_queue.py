"""The queue through the API: borrowing, reclaim by preemption, requeue at the original
position, cancel, a restart of the service, and evaluations/checkpoints listings."""

from __future__ import annotations

from fm_pipeline.api.control_plane import ControlPlane
from tests.api.conftest import auth
from tests.api.progress_files import write_checkpoint
from tests import local_site


def _submit(client, token, body, **change):
    r = client.post("/v1/training/jobs", json={**body, **change}, headers=auth(token))
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


def test_reclaim_preempts_borrowed_jobs_which_requeue_at_their_place_and_resume(
    client, plane, tokens, seed_body
):
    orch, research = plane.orchestrator, tokens["research"]
    small = {"gpus": 8, "parallelism": {"tp": 4, "pp": 2, "dp": 1}, "priority": "normal"}
    r_jobs = []
    for _ in range(4):  # 8 guaranteed + 24 borrowed: the whole pool of 32
        r_jobs.append(_submit(client, research, seed_body, **small))
        plane.clock.now += 60
    assert [c[0] for c in orch.calls] == ["submit"] * 4
    later = _submit(client, research, seed_body, **small)  # waits: the pool is full

    prod_job = _submit(client, tokens["prod"], seed_body)  # 16 GPUs, high: prod's own quota
    victims = [c[1] for c in orch.calls if c[0] == "preempt"]
    assert victims == [r_jobs[3], r_jobs[2]]  # the two most recently admitted borrowed jobs
    status = lambda j, t=research: client.get(  # noqa: E731
        f"/v1/training/jobs/{j}", headers=auth(t)).json()
    assert [status(v)["status"] for v in victims] == ["preempting", "preempting"]
    assert status(prod_job, tokens["prod"])["status"] == "queued"
    events = client.get(f"/v1/training/jobs/{r_jobs[3]}/events", headers=auth(research)).json()
    preempted = [e for e in events["events"] if e["kind"] == "preempted"]
    assert preempted[0]["detail"] == {"for": prod_job, "reason": "reclaim"}

    plane.clock.now += 30  # the victims checkpoint and exit
    for v in victims:
        orch.end(v, "preempted", "SIGTERM: checkpointed")
    plane.reconcile()
    assert status(prod_job, tokens["prod"])["status"] == "running"
    # Requeued at their original positions: ahead of the job submitted after them.
    assert [(status(j)["status"], status(j)["queue_position"]) for j in (r_jobs[2], r_jobs[3], later)
            ] == [("restarting", 1), ("restarting", 2), ("queued", 3)]
    assert status(r_jobs[2])["preemptions"] == 1

    tenants = client.get("/v1/tenants", headers=auth(tokens["admin"])).json()
    used = {t["tenant"]: (t["used_gpus"], t["queued"], t["running"]) for t in tenants["tenants"]}
    assert used == {"research": (16, 3, 2), "prod": (16, 0, 1)}
    assert [t["tenant"] for t in client.get("/v1/tenants", headers=auth(research)).json()[
        "tenants"]] == ["research"]

    plane.clock.now += 3600
    orch.end(prod_job, "succeeded")
    plane.reconcile()
    assert status(prod_job, tokens["prod"])["status"] == "succeeded"
    assert [c for c in orch.calls if c[0] == "resume"] == [
        ("resume", r_jobs[2], None), ("resume", r_jobs[3], None)]
    assert status(later)["queue_position"] == 1


def test_cancel_a_queued_job_and_the_queue_survives_a_restart(client, plane, tokens, seed_body,
                                                              mix_store):
    prod = tokens["prod"]
    running = _submit(client, prod, seed_body, gpus=32, parallelism={"tp": 4, "pp": 2, "dp": 4})
    waiting = [_submit(client, prod, seed_body) for _ in range(3)]
    r = client.post(f"/v1/training/jobs/{waiting[1]}/cancel", headers=auth(prod))
    assert (r.status_code, r.json()["status"]) == (202, "cancelled")

    # A new control plane over the same store: same queue, same order, same running job.
    restarted = ControlPlane(tenants=plane.tenants, orchestrator=plane.orchestrator,
                             store=local_site.job_store(), clock=plane.clock, site=local_site.site().with_store(mix_store["root"]))
    assert restarted.policy.running() == [running]
    assert [j.job_id for j in restarted.policy.pending()] == [waiting[0], waiting[2]]
    restarted.store.close()


def test_checkpoints_and_evaluations_come_from_the_jobs_files(client, plane, tokens, seed_body):
    prod = auth(tokens["prod"])
    job = _submit(client, tokens["prod"], seed_body)
    write_checkpoint(job, step=500, eval_loss={"code": 2.91, "prose": 3.40})
    write_checkpoint(job, step=1000)
    torn = write_checkpoint(job, step=1500)
    (torn / "manifest.json").unlink()  # a save that never committed

    ckpts = client.get(f"/v1/training/jobs/{job}/checkpoints", headers=prod).json()["checkpoints"]
    assert [(c["step"], c["committed"]) for c in ckpts] == [(1500, False), (1000, True),
                                                            (500, True)]
    assert "incomplete save" in ckpts[0]["problem"] and ckpts[2]["marks"] == ["eval"]
    status = client.get(f"/v1/training/jobs/{job}", headers=prod).json()
    assert status["last_ckpt_step"] == 1000 and status["step"] == 1000  # no metrics yet
    evals = client.get(f"/v1/training/jobs/{job}/evaluations", headers=prod).json()["evaluations"]
    assert evals == [{"step": 500, "checkpoint": ckpts[2]["location"],
                      "written_at": "2027-01-15T10:05:00Z",
                      "results": {"loss": {"code": 2.91, "prose": 3.40}}}]
