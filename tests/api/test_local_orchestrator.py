"""The local orchestrator runs a job as torchrun segments toward its target step, and a
preemption ends the run `preempted` through the trainer's exit-code contract."""

from __future__ import annotations

import time

from fm_pipeline.api.local_orchestrator import LocalOrchestrator
from fm_pipeline.config import parse_job
from fm_pipeline.config.paths import runs_dir
from fm_pipeline.data.testing import SMALL_JOB


def test_segments_run_in_turn_and_a_preempted_segment_ends_the_run(monkeypatch):
    job = parse_job({**SMALL_JOB, "name": "job-local",
                     "training": {**SMALL_JOB["training"], "steps": 4, "segment_steps": 2}})
    orch = LocalOrchestrator(trainer_module="tests.api.stand_in_trainer")
    monkeypatch.setenv("STAND_IN_HOLD_AT", "4")  # the second segment waits to be preempted
    orch.submit(job)
    log = runs_dir(job.name) / "stand_in.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and len(log.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the second segment never started"
        time.sleep(0.05)
    assert orch.status(job.name)[-1].state == "running"
    orch.preempt(job.name)
    run = orch.wait(job.name, timeout=120)
    assert log.read_text().split() == ["end_step=2", "end_step=4"]
    assert run.state == "preempted" and "preempted before step 4" in run.reason
    # Run records survive the orchestrator: a new one (a restarted service) reads them.
    assert [r.state for r in LocalOrchestrator().status(job.name)] == ["preempted"]
    assert orch.list() == ["job-local"]
