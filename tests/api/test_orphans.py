"""A control plane that died mid-run leaves Dagster runs STARTED and, possibly, a trainer
still running. The next `fm api serve` asks that trainer to checkpoint and stop and marks
the runs failed with the reason, so the Dagster UI and the API agree."""

from __future__ import annotations

import uuid

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus
from fm_pipeline.assets.training.api_orchestrator import DagsterOrchestrator
from fm_pipeline.assets.training.api_runs import LOST
from fm_pipeline.assets.training.names import SEGMENT_JOB, TAG_API_JOB, TAG_API_RUN

from fm_pipeline.config.paths import runs_dir

pytestmark = pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")


def _run(instance, job: str, status: DagsterRunStatus) -> str:
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name=SEGMENT_JOB, run_id=run_id, status=status,
                                tags={TAG_API_JOB: job, TAG_API_RUN: "1"}))
    return run_id


def test_runs_left_started_are_failed_and_their_trainers_asked_to_stop(fm_home):
    (fm_home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.get()
    orphan = _run(instance, "job-a", DagsterRunStatus.STARTED)
    finished = _run(instance, "job-b", DagsterRunStatus.SUCCESS)
    running = runs_dir("job-a") / "segments" / "00000010-x"  # torchrun without result.json
    running.mkdir(parents=True)
    (running / "job.yaml").write_text("name: job-a\n")
    done = runs_dir("job-a") / "segments" / "00000000-y"
    done.mkdir(parents=True)
    (done / "job.yaml").write_text("name: job-a\n")
    (done / "result.json").write_text("{}")

    recovered = DagsterOrchestrator(instance).recover_orphans()

    assert recovered == [orphan]
    assert instance.get_run_by_id(orphan).status == DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(finished).status == DagsterRunStatus.SUCCESS
    assert (running / "preempt").exists() and not (done / "preempt").exists()
    messages = [e.message for e in instance.all_logs(orphan)]
    assert any(LOST in (m or "") for m in messages)
    assert DagsterOrchestrator(instance).recover_orphans() == []  # nothing left to recover
