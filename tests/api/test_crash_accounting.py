"""The control plane's accounting follows the orchestrator's truth: a run that started is the
job's run, holding its GPUs, whatever the queue row says after an error or a killed
`fm api serve`. GPUs in use never exceed the pool, checked after every transition."""

from __future__ import annotations

import pytest

from fm_pipeline.api.auth import Principal
from fm_pipeline.api.control_plane import ControlPlane
from fm_pipeline.api.schemas import JobCreate
from tests.api.orchestrators import RecordingOrchestrator
from tests import local_site


class Killed(BaseException):
    """The API process dying at this point (nothing after it runs)."""


class FaultyOrchestrator(RecordingOrchestrator):
    """Starts runs as the recording one does, then fails as told: `before` (nothing
    started), `after` (the run started, the answer is lost) with an error or a kill."""

    def __init__(self, clock):
        super().__init__(clock)
        self.fault: tuple[str, type[BaseException]] | None = None

    def preempt(self, job_name):
        super().preempt(job_name)
        fault, self.fault = self.fault, None
        if fault and fault[0] == "preempt":  # the stop was asked; the row never heard of it
            raise fault[1]("the control plane died after asking the run to stop")

    def _start(self, job, checkpoint):
        fault, self.fault = self.fault, None
        if fault and fault[0] == "before":
            raise fault[1]("the orchestrator is unreachable")
        run_id = super()._start(job, checkpoint)
        if fault:
            raise fault[1]("the connection dropped after the run was submitted")
        return run_id


def in_use(plane: ControlPlane) -> tuple[int, int]:
    """GPUs the policy counts as held, and GPUs held by the orchestrator's active runs."""
    counted = sum(plane.policy.usage(t).get("gpu", 0) for t in plane.tenants.tenant_names)
    active = sum(r.gpus for r in plane.store.list()
                 if (runs := plane.orchestrator.status(r.job_id)) and not runs[-1].ended)
    return counted, active


def check_invariant(plane: ControlPlane) -> None:
    counted, active = in_use(plane)
    pool = plane.tenants.pool["gpu"]
    assert active <= pool, f"{active} GPUs in active runs, pool {pool}"
    assert counted >= active, f"policy counts {counted} GPUs, runs hold {active}"


@pytest.fixture
def faulty(plane):
    orch = FaultyOrchestrator(plane.clock)
    plane.orchestrator = orch
    return orch


def body(seed_body, gpus: int) -> JobCreate:
    per = {"gpus": gpus, "parallelism": {"tp": 4, "pp": 2, "dp": gpus // 8}}
    return JobCreate.model_validate({**seed_body, **per, "priority": "normal"})


PROD, RESEARCH = Principal(tenant="prod", token_id="t1"), Principal(tenant="research",
                                                                      token_id="t2")


def test_an_error_after_the_run_started_keeps_the_job_admitted(plane, faulty, seed_body):
    faulty.fault = ("after", RuntimeError)
    whole = plane.submit(PROD, body(seed_body, 32))
    check_invariant(plane)
    assert plane.store.get(whole.job_id).queue_state == "admitted"
    kinds = [e["kind"] for e in plane.store.events(whole.job_id)]
    assert "launch_failed" not in kinds and "admitted" in kinds
    other = plane.submit(PROD, body(seed_body, 8))  # the pool is full: it waits
    check_invariant(plane)
    assert plane.store.get(other.job_id).queue_state == "queued"
    assert [c[0] for c in faulty.calls] == ["submit"]
    # Another tenant's guaranteed quota is reclaimed by preemption, never by overcommit.
    plane.submit(RESEARCH, body(seed_body, 8))
    check_invariant(plane)
    assert [c[0] for c in faulty.calls] == ["submit", "preempt"]


def test_an_error_before_anything_started_fails_the_launch_and_frees_the_gpus(
        plane, faulty, seed_body):
    faulty.fault = ("before", RuntimeError)
    failed = plane.submit(PROD, body(seed_body, 32))
    assert plane.store.get(failed.job_id).queue_state == "done"
    assert "launch_failed" in [e["kind"] for e in plane.store.events(failed.job_id)]
    other = plane.submit(RESEARCH, body(seed_body, 8))
    check_invariant(plane)
    assert plane.store.get(other.job_id).queue_state == "admitted"


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_control_plane_killed_mid_submit_restarts_with_the_truth(
        plane, faulty, seed_body, mix_store, where):
    faulty.fault = (where, Killed)
    with pytest.raises(Killed):
        plane.submit(PROD, body(seed_body, 32))
    (record,) = plane.store.list()
    assert record.queue_state == "queued"  # the row never heard of the run
    plane.store.close()

    # `fm api serve` comes back over the same queue and the same orchestrator.
    again = ControlPlane(tenants=plane.tenants, orchestrator=faulty, store=local_site.job_store(),
                         clock=plane.clock, site=local_site.site().with_store(mix_store["root"]))
    check_invariant(again)
    again.reconcile()
    check_invariant(again)
    other = again.submit(PROD, body(seed_body, 8))
    check_invariant(again)
    runs = faulty.status(record.job_id)
    assert len(runs) == 1 and not runs[0].ended  # one run: adopted, or launched once now
    assert again.store.get(record.job_id).queue_state == "admitted"
    assert again.store.get(other.job_id).queue_state == "queued"  # the pool is full
    tries = [c[0] for c in faulty.calls if c[1] == record.job_id]
    assert tries == (["submit"] if where == "after" else ["submit", "submit"])
    again.store.close()


def test_a_control_plane_killed_mid_resume_does_not_start_a_second_run(
        plane, faulty, seed_body, mix_store):
    job = plane.submit(PROD, body(seed_body, 32))
    faulty.end(job.job_id, "failed", reason="a worker died")
    plane.reconcile()
    assert plane.store.get(job.job_id).queue_state == "done"
    faulty.fault = ("after", Killed)
    with pytest.raises(Killed):
        plane.resume(PROD, job.job_id, None)
    plane.store.close()
    again = ControlPlane(tenants=plane.tenants, orchestrator=faulty, store=local_site.job_store(),
                         clock=plane.clock, site=local_site.site().with_store(mix_store["root"]))
    again.reconcile()
    check_invariant(again)
    assert [c[0] for c in faulty.calls] == ["submit", "resume"]
    assert again.store.get(job.job_id).queue_state == "admitted"
    again.store.close()


def test_a_control_plane_killed_mid_preemption_requeues_the_victim_and_never_overcommits(
        plane, faulty, seed_body, mix_store):
    victim = plane.submit(PROD, body(seed_body, 32))  # borrows research's share
    check_invariant(plane)
    faulty.fault = ("preempt", Killed)
    with pytest.raises(Killed):  # research reclaims its quota: the preemption dies midway
        plane.submit(RESEARCH, body(seed_body, 8))
    assert [c[0] for c in faulty.calls] == ["submit", "preempt"]
    assert plane.store.get(victim.job_id).stop_requested is None  # the row never heard
    plane.store.close()

    again = ControlPlane(tenants=plane.tenants, orchestrator=faulty, store=local_site.job_store(),
                         clock=plane.clock, site=local_site.site().with_store(mix_store["root"]))
    again.reconcile()
    check_invariant(again)  # the victim still runs: its GPUs are counted, nothing starts
    (waiting,) = [r for r in again.store.list() if r.tenant == "research"]
    assert again.store.get(waiting.job_id).queue_state == "queued"
    faulty.end(victim.job_id, "preempted")  # the stop asked before the crash lands
    again.reconcile()
    check_invariant(again)
    assert again.store.get(victim.job_id).queue_state == "queued"  # requeued, not lost
    assert again.store.get(waiting.job_id).queue_state == "admitted"
    assert len(faulty.status(waiting.job_id)) == 1
    again.store.close()
