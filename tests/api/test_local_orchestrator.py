"""The local orchestrator (`fm api serve --orchestrator local`) carries a job to its target
on the decisions the Dagster path makes: each segment planned by plan_segment and carried to
the trainer as --resume-from ... --planned, a failure resumed by the retry policy, a
rollback honoured, a preemption ending the run `preempted` through the trainer's exit code.
The real trainer runs under torchrun on a small job."""

from __future__ import annotations

import time

import pytest

from fm_pipeline.api.local_orchestrator import LocalOrchestrator
from tests.local_site import runs_dir, store_uri
from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.orchestration.registry import plant_fault
from fm_pipeline.orchestration.retry import RetryPolicy
from fm_pipeline.rundir.events import read_events
from fm_pipeline.storage import open_store
from tests.orchestration.plans import FAULT, PLANS, SHAPE, planned_segments, step_of
from tests import local_site


@pytest.fixture
def job():
    job = small_job(**{"name": "job-local", **SHAPE, "resilience.inplace_restarts": 0,
                       "resilience.inprocess_restart": False})
    build_small_mix(job, store=local_site.site().store())
    return job


def _orchestrator() -> LocalOrchestrator:
    return LocalOrchestrator(policy=RetryPolicy(backoff_base_s=0.0, backoff_max_s=0.0), site=local_site.site())


def test_a_failed_segment_resumes_by_the_retry_policy_from_the_planned_checkpoint(job):
    plant_fault(open_store(store_uri()), job.name, FAULT)
    orch = _orchestrator()
    orch.submit(job)
    run = orch.wait(job.name, timeout=300)
    assert run.state == "succeeded", run.reason
    assert planned_segments(job.name) == PLANS  # as the Dagster path's (test_sensors.py)
    # The trainer restored what was planned each time: nothing to report.
    assert read_events(local_site.runs_dir(job.name), kinds=("resume_plan_differs",))[0] == []
    restored = [step_of(r.get("restored_from")) for r in _segment_records(job)]
    assert restored == [None, 2, 2, 4]  # the segments that trained (the failed one too)
    # Run records survive the orchestrator: a new one (a restarted service) reads them.
    assert [r.state for r in _orchestrator().status(job.name)] == ["succeeded"]
    assert orch.list() == ["job-local"]

    # A rollback: the first segment starts at the named checkpoint (not the newest), the
    # trainer gets it without --planned, and the run goes on from there to the target.
    at_two = next(r for r in _checkpoints(job) if r.step == 2)
    orch.resume(job, checkpoint=at_two.location)
    run = orch.wait(job.name, timeout=300)
    assert run.state == "succeeded", run.reason
    assert planned_segments(job.name)[4:] == [(2, 4, 2, True), (4, 6, 4, False)]


def test_a_stop_ends_the_run_preempted_at_a_checkpoint(job, monkeypatch):
    monkeypatch.setenv("FM_FAULT_SLOW_RANKS", "0:1.0")  # a second per step: time to stop it
    orch = _orchestrator()
    orch.submit(job)
    metrics = runs_dir(job.name) / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and '"step": 1' in metrics.read_text()):
        assert time.monotonic() < deadline, "the first segment never trained a step"
        time.sleep(0.1)
    assert orch.status(job.name)[-1].state == "running"
    orch.preempt(job.name)
    run = orch.wait(job.name, timeout=120)
    assert run.state == "preempted", run.reason
    assert "preempted" in run.reason
    assert len(planned_segments(job.name)) == 1  # no segment after the stop


def _segment_records(job) -> list[dict]:
    import json

    path = runs_dir(job.name) / "segments.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_fm_api_serve_builds_its_retry_policy_from_the_environment(monkeypatch):
    from fm_pipeline.cli.api import _orchestrator

    assert _orchestrator("local", local_site.site()).policy == RetryPolicy()
    monkeypatch.setenv("FM_RETRY_BACKOFF_S", "3")
    assert _orchestrator("local", local_site.site()).policy == RetryPolicy.first_backoff(3.0)


def _checkpoints(job):
    from fm_pipeline.catalog.validate import candidates

    return candidates(job.name, store=open_store(store_uri()), root=local_site.root_of(job.name))
