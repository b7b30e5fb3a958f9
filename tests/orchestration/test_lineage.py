"""The whole training lineage on a small real job, through Dagster in process: real
torchrun segments (one rank, the debug model), checkpoints with their blocking validation,
per-domain evaluation of each checkpoint, a restore drill on another topology; every run
after the first requested by the real sensors and schedule (PipelineDriver), including the
resume after an injected failure (FM_FAULT_FAIL_AT)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    RunsFilter,
)
from fm_pipeline.assets.training.driver import PipelineDriver
from fm_pipeline.assets.training.names import EVALUATION_JOB, SEGMENT_JOB
from fm_pipeline.assets.training.requests import checkpoint_request
from fm_pipeline.assets.training.submit import first_segment_request, register_training_job
from fm_pipeline.assets.training.summary import job_report
from fm_pipeline.resources.launcher_local import LocalLauncher
from fm_pipeline.resources.training_policy import TrainingPolicyResource

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.storage import open_store

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]
JOB = "lineage"


def check_results(instance, run_id: str) -> list:
    """The checkpoint_valid evaluations of one run."""
    logs = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    return [e.dagster_event.event_specific_data for e in logs
            if e.dagster_event.event_specific_data.check_name == "checkpoint_valid"]


class Ran:
    def __init__(self, home: Path, instance, driver: PipelineDriver, job):
        self.home, self.instance, self.driver, self.job = home, instance, driver, job

    def materializations(self, key: str) -> list[dict]:
        records = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(key), asset_partitions=[JOB]),
            limit=100, ascending=True).records
        return [{k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
                | {"run_id": r.event_log_entry.run_id} for r in records]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    home = tmp_path_factory.mktemp("lineage")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"FM_HOME": home, "DAGSTER_HOME": home / "dagster"}.items():
            mp.setenv(key, str(value))
        for key in ("FM_STORE_URI", "FM_MLFLOW_URI"):
            mp.delenv(key, raising=False)
        (home / "dagster").mkdir()
        (home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        job = small_job(**{"name": JOB, "training.steps": 4, "training.segment_steps": 2,
                           "checkpoint.every_steps": 2, "training.lr": 1e-2})
        store = open_store(str(home / "store"))
        build_small_mix(job, store=store)
        instance = DagsterInstance.get()
        register_training_job(instance, job, store=store)
        driver = PipelineDriver(instance, faults={JOB: "0:3"}, resources={
            "launcher": LocalLauncher(echo_output=False),
            "training_policy": TrainingPolicyResource(backoff_base_s=0.5)})
        driver.execute(SEGMENT_JOB, first_segment_request(job, store=store), origin="submit")
        driver.run_until_idle()
        driver.drill()
        yield Ran(home, instance, driver, job)
        instance.dispose()


def test_the_sensors_and_the_schedule_requested_every_run_after_the_first(ran):
    runs = [(r.job_name, r.origin, r.success) for r in ran.driver.runs]
    assert runs == [
        ("training_segment_job", "submit", True),
        ("checkpoint_evaluation_job", "checkpoint_evaluation_sensor", True),
        ("training_segment_job", "segment_progress_sensor", False),  # the injected fault
        ("training_segment_job", "segment_progress_sensor", True),  # resumed after backoff
        ("checkpoint_evaluation_job", "checkpoint_evaluation_sensor", True),
        ("restore_drill_job", "restore_drill_schedule", True),
    ]


def test_segments_record_their_step_range_mfu_goodput_and_the_plan(ran):
    segments = ran.materializations("training_segment")
    assert [(s["start_step"], s["end_step"]) for s in segments] == [(0, 2), (2, 4)]
    for s in segments:
        assert 0 < s["mean_mfu"] < 1 and s["tokens_per_s"] > 0 and 0 < s["goodput"] <= 1
        assert s["step_time_s"] == pytest.approx(ran.job.tokens_per_step / s["tokens_per_s"],
                                                 rel=1e-4)
        assert s["predicted_step_time_s"] > 0 and "plan" in s["plan_verdict"]
        assert Path(s["checkpoint"]).name == f"step-{s['end_step']:08d}"
    assert segments[1]["restored_from"].endswith("step-00000002")
    # The job's goodput counts the failed launch's wall time too: below the segment's own.
    assert 0 < segments[1]["job_goodput"] < segments[1]["goodput"]


def test_the_injected_failure_is_recorded_and_resumed_from_the_last_valid_checkpoint(ran):
    report = job_report(ran.instance, JOB)
    failed = [s for s in report.segments if s["status"] == "FAILURE"]
    assert len(failed) == 1
    (f,) = failed
    assert f["failed_at_step"] == 3 and "InjectedFault" in f["reason"]
    assert "rank 0 fails after step 3" in f["reason"] and f["decision"] == "resumed"
    resumed = ran.instance.get_runs(filters=RunsFilter(tags={"fm/resumes_run": f["run_id"]}))
    assert len(resumed) == 1
    tags = resumed[0].tags
    assert tags["fm/trigger"] == "resume_after_failure"
    assert tags["fm/resume_from"].endswith("step-00000002") and tags["fm/start_step"] == "2"
    assert report.reached_step == 4 and 0 < report.goodput < 1


def test_each_checkpoint_is_validated_then_evaluated_per_domain(ran):
    assert [c["step"] for c in ran.materializations("checkpoint")] == [2, 4]
    for run in ran.driver.runs:  # segment runs check what they recorded, evaluations theirs
        if run.success and run.job_name in (SEGMENT_JOB, EVALUATION_JOB):
            (check,) = check_results(ran.instance, run.run_id)
            assert check.passed, check.description
    evals = {e["checkpoint_step"]: e for e in ran.materializations("evaluation")}
    assert sorted(evals) == [2, 4]
    for e in evals.values():
        for domain in ("code", "prose"):
            assert e[f"{domain}/perplexity"] == pytest.approx(math.exp(e[f"{domain}/loss"]),
                                                              rel=1e-5)
        assert 0 < e["loss"] < 20 and e["topology"].startswith("dp_replicate 1 x dp_shard 1")
    # (tests/eval checks that training lowers each domain's loss below the initial model's)


def test_the_newest_checkpoint_passed_a_restore_drill_on_another_topology(at_home):
    ran = at_home
    (drill,) = ran.materializations("restore_drill")
    assert drill["checkpoint_step"] == 4 and drill["passed"] is True
    assert drill["source_topology"] != drill["drill_topology"]
    assert drill["drill_topology"].startswith("world 2")
    assert ran.driver.drill() == []  # the schedule leaves a drilled checkpoint alone


def test_mlflow_has_the_job_run_with_a_child_run_per_segment_evaluation_and_drill(ran):
    from fm_pipeline.tracking import JobTracker

    tracker = JobTracker(f"sqlite:///{ran.home / 'mlflow.db'}")
    assert tracker.find_job_run(JOB) is not None
    segments = tracker.segment_runs(JOB)
    assert sorted(r.data.tags.get("fm.outcome") for r in segments) == \
        ["failed", "succeeded", "succeeded"]
    assert len(tracker.checkpoint_runs(JOB, kind="evaluation")) == 2
    (drill,) = tracker.checkpoint_runs(JOB, kind="drill")
    assert drill.data.tags["fm.drill_passed"] == "true"


@pytest.fixture
def at_home(ran, monkeypatch):
    """The module's FM_HOME / DAGSTER_HOME (each test otherwise gets its own)."""
    monkeypatch.setenv("FM_HOME", str(ran.home))
    monkeypatch.setenv("DAGSTER_HOME", str(ran.home / "dagster"))
    return ran


def test_a_tampered_checkpoint_fails_validation_and_its_evaluation_is_skipped(at_home):
    ran = at_home
    shard = next((ran.home / "runs" / JOB / "checkpoints" / "step-00000002").glob("*.distcp"))
    original = shard.read_bytes()
    evaluated = len(ran.materializations("evaluation"))
    shard.write_bytes(original[:100] + bytes([original[100] ^ 0xFF]) + original[101:])
    try:
        run = ran.driver.execute(EVALUATION_JOB, checkpoint_request(JOB, 2, kind="evaluate")
                                 .with_replaced_attrs(run_key=None), origin="test")
    finally:
        shard.write_bytes(original)
    assert not run.success
    assert len(ran.materializations("evaluation")) == evaluated  # evaluation never ran
    (check,) = check_results(ran.instance, run.run_id)
    assert not check.passed and shard.name in check.description
