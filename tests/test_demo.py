"""`fm demo` (= `make demo`) as a user runs it: the whole pipeline on the embedded defaults
in a fresh FM_HOME, and a report that says what happened; then the lineage the dense demo
left in Dagster and MLflow, read from its instance after the demo (and its daemon) ended.

The dense demo is the lineage test: a real Dagster deployment (the instance's dagster.yaml,
`dagster-daemon`), real torchrun segments (2 ranks, FSDP), checkpoints with their blocking
validation, per-domain evaluation of each checkpoint, a restore drill on another topology;
every run started by the daemon: the first from a submission (the intake sensor), the rest
requested by the real sensors, including the resume after the injected failure."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    SkipReason,
    build_schedule_context,
)

from fm_pipeline.assets.training.schedules import restore_drill_schedule
from fm_pipeline.dagster_runs.names import EVALUATION_JOB, SEGMENT_JOB
from fm_pipeline.dagster_runs.requests import checkpoint_request
from fm_pipeline.dagster_runs.summary import job_report
from tests.conftest import REPO
from tests.deploy.stack import use_home

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]
JOB = "demo-1"  # configs/demo.yaml's job, the first of its name in a fresh FM_HOME
CHECKPOINTS = [10, 20, 30, 40, 50, 60]


def _processes_of(home) -> list[str]:
    """Command lines of live processes that name `home` (a daemon, a code server, a run)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(home) in cmd and "pytest" not in cmd:
                found.append(cmd[:200])
    return found


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "FM_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"),
           "COLUMNS": "200"}
    for key in ("FM_STORE_URI", "FM_MLFLOW_URI"):
        env.pop(key, None)
    return env


@dataclass
class Demo:
    home: Path
    out: subprocess.CompletedProcess
    instance: DagsterInstance

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
def demo(tmp_path_factory):
    """Started in the background the way CI runners and nohup start it (a non-interactive
    shell's `&` leaves SIGINT ignored): every run is launched by the demo's dagster-daemon,
    which is stopped with everything it started when the demo ends."""
    home = tmp_path_factory.mktemp("demo") / "fm_home"
    (home / "dagster").mkdir(parents=True)
    command = f"{sys.executable} -m fm_pipeline.cli.main demo --backoff-s 0.5 & wait $!"
    out = subprocess.run(["sh", "-c", command], cwd=REPO, env=_env(home), capture_output=True,
                         text=True, timeout=900)
    instance = DagsterInstance.from_config(str(home / "dagster"))
    try:
        yield Demo(home, out, instance)
    finally:
        instance.dispose()


@pytest.fixture
def at_home(demo, monkeypatch):
    """The demo's FM_HOME / DAGSTER_HOME (each test otherwise gets its own)."""
    use_home(monkeypatch, demo.home)
    return demo


def test_demo_runs_the_whole_pipeline_through_the_daemon_and_reports_it(demo):
    out, home = demo.out, demo.home
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert not _processes_of(home), _processes_of(home)
    daemon_log = (home / "dagster" / "services" / "daemon.log").read_text()
    assert "run_intake_sensor" in daemon_log and "segment_failure_sensor" in daemon_log
    # the data mix: both domains, what was dropped, Dagster's checks
    assert re.search(r"^ code +0\.6 ", text, re.M) and re.search(r"^ prose +0\.4 ", text, re.M)
    assert re.search(r"checks: (\d+)/\1 passed", text)
    # training: three segments, the injected failure, the sensor's resume, the target step
    assert re.search(r"20->40 +next_segment +failed at step 35", text)
    assert "segment_failure_sensor -> resumed" in text
    assert re.search(r"30->40 +resume_after_failure +completed", text)
    assert f"{JOB}: step 60/60 in 4 segment launches (1 resumed)" in text
    # every checkpoint evaluated per domain, the drill on another topology passed
    for step in CHECKPOINTS:
        assert re.search(rf"^ +{step} +\d+\.\d+ / \d+ +\d+\.\d+ / \d+", text, re.M), step
    assert "passed: world 2 (dp_shard 2) -> world 1" in text
    figure = home / "runs" / JOB / "training.png"
    assert figure.stat().st_size > 10_000 and str(figure) in text.replace("\n", "")


def check_results(instance, run_id: str) -> list:
    """The checkpoint_valid evaluations of one run."""
    logs = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    return [e.dagster_event.event_specific_data for e in logs
            if e.dagster_event.event_specific_data.check_name == "checkpoint_valid"]


def test_the_daemon_started_every_run_the_sensors_requested(demo):
    runs = demo.runs()
    assert runs[0] == ("data_mix_job", "run_intake_sensor", True)
    segments = [r for r in runs if r[0] == SEGMENT_JOB]
    assert segments[0] == (SEGMENT_JOB, "run_intake_sensor", True)  # the submission
    assert segments[1] == (SEGMENT_JOB, "segment_progress_sensor", False)  # the fault
    assert segments[2][2] and segments[2][1] in ("segment_failure_sensor",  # resumed at once
                                                 "segment_progress_sensor")  # after backoff
    assert segments[3] == (SEGMENT_JOB, "segment_progress_sensor", True)
    assert len(segments) == 4
    # An evaluation run takes every checkpoint not yet evaluated (one or more).
    evaluations = [r for r in runs if r[0] == EVALUATION_JOB]
    assert evaluations and set(evaluations) == {
        (EVALUATION_JOB, "checkpoint_evaluation_sensor", True)}
    assert [r for r in runs if r[0] == "restore_drill_job"] == [
        ("restore_drill_job", "run_intake_sensor", True)]


def test_segments_record_their_step_range_mfu_goodput_and_the_plan(demo):
    from fm_pipeline.dagster_runs.history import attempts
    from fm_pipeline.orchestration import job_goodput

    segments = demo.materializations("training_segment")
    assert [(s["start_step"], s["end_step"]) for s in segments] == [(0, 20), (30, 40), (40, 60)]
    tokens_per_step = 16 * 128  # configs/demo.yaml: global batch x seq_len
    for s in segments:
        assert 0 < s["mean_mfu"] < 1 and s["tokens_per_s"] > 0 and 0 < s["goodput"] <= 1
        assert s["step_time_s"] == pytest.approx(tokens_per_step / s["tokens_per_s"], rel=1e-4)
        assert s["predicted_step_time_s"] > 0 and "plan" in s["plan_verdict"]
        assert Path(s["checkpoint"]).name == f"step-{s['end_step']:08d}"
    assert segments[1]["restored_from"].endswith("step-00000030")
    # The job's goodput counts the failed launch's wall time too: below what the same
    # formula gives over the successful launches alone (comparing with the segment's own
    # goodput is noise: each uses its own step time).
    measured = [a for a in attempts(demo.instance, JOB) if a.step_time_s]
    assert len(measured) == 3
    without_the_failure = job_goodput(reached_step=60,
                                      step_times_s=[a.step_time_s for a in measured],
                                      launch_wall_s=[a.wall_s for a in measured])
    assert 0 < segments[-1]["job_goodput"] < without_the_failure


def test_the_injected_failure_is_recorded_and_resumed_from_the_last_valid_checkpoint(demo):
    report = job_report(demo.instance, JOB, runs=demo.home / "runs" / JOB)
    failed = [s for s in report.segments if s["status"] == "FAILURE"]
    assert len(failed) == 1
    (f,) = failed
    assert f["failed_at_step"] == 35 and "InjectedFault" in f["reason"]
    assert "rank 1 fails after step 35" in f["reason"] and f["decision"] == "resumed"
    resumed = demo.instance.get_runs(filters=RunsFilter(tags={"fm/resumes_run": f["run_id"]}))
    assert len(resumed) == 1
    tags = resumed[0].tags
    assert tags["fm/trigger"] == "resume_after_failure"
    assert tags["fm/resume_from"].endswith("step-00000030") and tags["fm/start_step"] == "30"
    assert report.reached_step == 60 and 0 < report.goodput < 1


def test_each_checkpoint_is_validated_then_evaluated_per_domain(demo):
    assert [c["step"] for c in demo.materializations("checkpoint")] == CHECKPOINTS
    assert {c["topology"] for c in demo.materializations("checkpoint")} == {
        "world 2 (dp_shard 2)"}
    for record in demo.instance.get_run_records():  # segments check what they recorded,
        run = record.dagster_run                      # evaluations what they read
        if run.status == DagsterRunStatus.SUCCESS and run.job_name in (SEGMENT_JOB,
                                                                       EVALUATION_JOB):
            checks = check_results(demo.instance, run.run_id)
            assert checks and all(c.passed for c in checks), [c.description for c in checks]
    evals = {e["checkpoint_step"]: e for e in demo.materializations("evaluation")}
    assert sorted(evals) == CHECKPOINTS
    for e in evals.values():
        for domain in ("code", "prose"):
            assert e[f"{domain}/perplexity"] == pytest.approx(math.exp(e[f"{domain}/loss"]),
                                                              rel=1e-5)
        assert 0 < e["loss"] < 20 and e["topology"].startswith("dp_replicate 1 x dp_shard 1")
    # (tests/eval checks that training lowers each domain's loss below the initial model's)


def test_the_newest_checkpoint_passed_a_restore_drill_on_another_topology(at_home):
    (drill,) = at_home.materializations("restore_drill")
    assert drill["checkpoint_step"] == 60 and drill["passed"] is True
    assert drill["source_topology"] == "world 2 (dp_shard 2)"
    assert drill["drill_topology"].startswith("world 1")
    # The schedule leaves a drilled checkpoint alone.
    skipped = restore_drill_schedule(build_schedule_context(instance=at_home.instance))
    assert isinstance(skipped, SkipReason) and "drilled" in skipped.skip_message


def test_mlflow_has_the_job_run_with_a_child_run_per_segment_evaluation_and_drill(demo):
    from fm_pipeline.tracking import JobTracker

    tracker = JobTracker(f"sqlite:///{demo.home / 'mlflow.db'}")
    assert tracker.find_job_run(JOB) is not None
    segments = tracker.segment_runs(JOB)
    assert sorted(r.data.tags.get("fm.outcome") for r in segments) == \
        ["failed", "succeeded", "succeeded", "succeeded"]
    assert len(tracker.checkpoint_runs(JOB, kind="evaluation")) == len(CHECKPOINTS)
    (drill,) = tracker.checkpoint_runs(JOB, kind="drill")
    assert drill.data.tags["fm.drill_passed"] == "true"


def test_a_tampered_checkpoint_fails_validation_and_its_evaluation_is_skipped(at_home):
    demo = at_home
    shard = next((demo.home / "runs" / JOB / "checkpoints" / "step-00000020").glob("*.distcp"))
    original = shard.read_bytes()
    evaluated = len(demo.materializations("evaluation"))
    shard.write_bytes(original[:100] + bytes([original[100] ^ 0xFF]) + original[101:])
    request = checkpoint_request(JOB, 20, kind="evaluate")
    try:  # in process: this test is about the check, not about who starts the run
        from fm_pipeline.definitions import defs

        run = defs.resolve_job_def(EVALUATION_JOB).execute_in_process(
            instance=demo.instance, partition_key=request.partition_key,
            run_config=request.run_config, tags=dict(request.tags), raise_on_error=False)
    finally:
        shard.write_bytes(original)
    assert not run.success
    assert len(demo.materializations("evaluation")) == evaluated  # evaluation never ran
    (check,) = check_results(demo.instance, run.run_id)
    assert not check.passed and shard.name in check.description


def test_the_moe_demo_trains_expert_parallel_through_the_same_pipeline(fm_home):
    """configs/demo-moe.yaml: moe-tiny with its experts over 2 ranks (ep 2), the injected
    failure resumed by the sensor, drills restoring the expert-parallel checkpoints on one
    process, and the router's load in the report."""
    out = subprocess.run(
        [sys.executable, "-m", "fm_pipeline.cli.main", "demo", "--job", "configs/demo-moe.yaml",
         "--backoff-s", "0.5"], cwd=REPO, env=_env(fm_home), capture_output=True, text=True,
        timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert not _processes_of(fm_home), _processes_of(fm_home)
    assert re.search(r"20->40 +next_segment +failed at step 35", text)
    assert re.search(r"30->40 +resume_after_failure +completed", text)
    assert "demo-moe-1: step 40/40 in 3 segment launches (1 resumed)" in text
    assert "passed: world 2 (dp_shard 2 x ep 2) -> world 1" in text
    load = re.search(r"router at step 40: the busiest expert took (\d+\.\d+)x the mean load", text)
    assert load and 1.0 <= float(load.group(1)) < 8, text[-2000:]
    segment = (fm_home / "runs" / "demo-moe-1" / "segments.jsonl").read_text()
    assert '"ep": 2' in segment
