"""The whole training lineage on a small real job, on a real Dagster deployment (the
instance's dagster.yaml, `dagster-daemon`): real torchrun segments (one rank, the debug
model), checkpoints with their blocking validation, per-domain evaluation of each
checkpoint, a restore drill on another topology; every run started by the daemon: the
first from a submission (the intake sensor), the rest requested by the real sensors,
including the resume after an injected failure (a fault planted for the job)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterRunStatus,
    RunsFilter,
    SkipReason,
    build_schedule_context,
)
from fm_pipeline.dagster_runs.names import EVALUATION_JOB, SEGMENT_JOB
from fm_pipeline.dagster_runs.requests import checkpoint_request
from fm_pipeline.assets.training.schedules import restore_drill_schedule
from fm_pipeline.dagster_runs.submit import register_training_job
from fm_pipeline.dagster_runs.summary import job_report
from rich.progress import Progress

from fm_pipeline.cli.follow import RunFollower
from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.orchestration.registry import plant_fault
from fm_pipeline.orchestration.submissions import submit_run
from fm_pipeline.storage import open_store
from tests.deploy.stack import deployment, use_home
from tests import local_site

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]
JOB = "lineage"


def check_results(instance, run_id: str) -> list:
    """The checkpoint_valid evaluations of one run."""
    logs = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    return [e.dagster_event.event_specific_data for e in logs
            if e.dagster_event.event_specific_data.check_name == "checkpoint_valid"]


class Ran:
    def __init__(self, home: Path, instance, job):
        self.home, self.instance, self.job = home, instance, job

    def materializations(self, key: str) -> list[dict]:
        records = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(key), asset_partitions=[JOB]),
            limit=100, ascending=True).records
        return [{k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
                | {"run_id": r.event_log_entry.run_id} for r in records]

    def runs(self) -> list:
        """(job, what started it, succeeded) of every run, oldest first."""
        out = []
        for record in self.instance.get_run_records(ascending=True):
            run = record.dagster_run
            origin = run.tags.get("dagster/sensor_name") or run.tags.get(
                "dagster/schedule_name") or "outside the daemon"
            out.append((run.job_name, origin, run.status == DagsterRunStatus.SUCCESS))
        return out


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    home = tmp_path_factory.mktemp("lineage")
    store_dir = home / "store"
    with pytest.MonkeyPatch.context() as mp:
        use_home(mp, home)
        job = small_job(**{"name": JOB, "training.steps": 4, "training.segment_steps": 2,
                           "checkpoint.every_steps": 2, "training.lr": 1e-2})
        store = open_store(str(store_dir))
        build_small_mix(job, store=store)
        env = {"FM_STORE_URI": str(store_dir), "FM_RETRY_BACKOFF_S": "0.5"}
        with deployment(home, env=env) as stack:
            register_training_job(stack.instance, job, store=store)
            plant_fault(store, JOB, "0:3")  # rank 0 raises after step 3, once
            submit_run(store, job)
            follower = RunFollower(Progress(disable=True), stack.instance, JOB,
                                   target_step=4)
            follower.wait_until_idle(api_run=1, timeout_s=900)
            follower.wait_for_key(submit_run(store, job, kind="drill").run_key)
            yield Ran(home, stack.instance, job)


def test_the_daemon_started_every_run_the_sensors_requested(ran):
    runs = ran.runs()
    segments = [r for r in runs if r[0] == SEGMENT_JOB]
    assert segments[0] == (SEGMENT_JOB, "run_intake_sensor", True)  # the submission
    assert segments[1] == (SEGMENT_JOB, "segment_progress_sensor", False)  # the fault
    assert segments[2][2] and segments[2][1] in ("segment_failure_sensor",  # resumed at once
                                                 "segment_progress_sensor")  # after backoff
    assert len(segments) == 3
    assert [r for r in runs if r[0] == EVALUATION_JOB] == [
        (EVALUATION_JOB, "checkpoint_evaluation_sensor", True)] * 2
    assert [r for r in runs if r[0] == "restore_drill_job"] == [
        ("restore_drill_job", "run_intake_sensor", True)]


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
    # The job's goodput counts the failed launch's wall time too: below what the same
    # formula gives over the successful launches alone (comparing with the segment's own
    # goodput is noise: each uses its own step time).
    from fm_pipeline.dagster_runs.history import attempts
    from fm_pipeline.orchestration import job_goodput

    measured = [a for a in attempts(ran.instance, JOB) if a.step_time_s]
    assert len(measured) == 2
    without_the_failure = job_goodput(reached_step=4,
                                      step_times_s=[a.step_time_s for a in measured],
                                      launch_wall_s=[a.wall_s for a in measured])
    assert 0 < segments[1]["job_goodput"] < without_the_failure


def test_the_injected_failure_is_recorded_and_resumed_from_the_last_valid_checkpoint(ran):
    report = job_report(ran.instance, JOB, runs=local_site.runs_dir(JOB))
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
    for record in ran.instance.get_run_records():  # segments check what they recorded,
        run = record.dagster_run                     # evaluations what they read
        if run.status == DagsterRunStatus.SUCCESS and run.job_name in (SEGMENT_JOB,
                                                                       EVALUATION_JOB):
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
    # The schedule leaves a drilled checkpoint alone.
    skipped = restore_drill_schedule(build_schedule_context(instance=ran.instance))
    assert isinstance(skipped, SkipReason) and "drilled" in skipped.skip_message


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
    use_home(monkeypatch, ran.home)
    return ran


def test_a_tampered_checkpoint_fails_validation_and_its_evaluation_is_skipped(at_home):
    ran = at_home
    shard = next((ran.home / "runs" / JOB / "checkpoints" / "step-00000002").glob("*.distcp"))
    original = shard.read_bytes()
    evaluated = len(ran.materializations("evaluation"))
    shard.write_bytes(original[:100] + bytes([original[100] ^ 0xFF]) + original[101:])
    request = checkpoint_request(JOB, 2, kind="evaluate")
    try:  # in process: this test is about the check, not about who starts the run
        from fm_pipeline.definitions import defs

        run = defs.resolve_job_def(EVALUATION_JOB).execute_in_process(
            instance=ran.instance, partition_key=request.partition_key,
            run_config=request.run_config, tags=dict(request.tags), raise_on_error=False)
    finally:
        shard.write_bytes(original)
    assert not run.success
    assert len(ran.materializations("evaluation")) == evaluated  # evaluation never ran
    (check,) = check_results(ran.instance, run.run_id)
    assert not check.passed and shard.name in check.description
