"""Preemption: SIGTERM (what torchrun forwards, and what Kubernetes sends) or the preStop flag
file makes every rank stop after the same step, commit a checkpoint and exit 75 well inside
the grace period; the next segment resumes from that checkpoint."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fm_pipeline.catalog import CheckpointRef, read_manifest, validate
from fm_pipeline.config import load_job
from fm_pipeline.rundir import exit_codes
from tests.conftest import REPO
from tests.train.launch import env_for, failure, torchrun_cmd, train, write_job
from tests.train.pipes import pipes_env, read_messages

pytestmark = pytest.mark.slow

LONG = {"training.steps": 40, "training.segment_steps": 40, "training.rank_timings_every": 1}


def _start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_step(ws, job: str, step: int, proc: subprocess.Popen, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"trainer exited early: {proc.communicate()[1][-3000:]}")
        if any(r["step"] >= step for r in ws.metrics(job)):
            return
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"{job} did not reach step {step} in {timeout}s")


def _assert_preempted_with_valid_checkpoint(ws, name: str, job_path):
    (segment,) = ws.segments(name)
    assert segment["exit_code"] == exit_codes.PREEMPTED
    assert segment["exit_reason"] == "preempted"
    stopped_at = segment["end_step"]
    assert 2 <= stopped_at < 40
    ref = CheckpointRef.local(ws.checkpoint(name, stopped_at))
    assert segment["checkpoint"] == str(ref.dir)
    assert validate(ref, load_job(job_path)) == []  # checksums, DCP metadata, model
    assert read_manifest(ref).step == stopped_at
    assert segment["preempt_to_exit_s"] < load_job(job_path).training.preemption_grace_s
    return segment


def test_sigterm_to_torchrun_checkpoints_and_exits_preempted(workspace, tmp_path):
    ws = workspace
    job = write_job(ws.jobs, "preempt-sigterm", nproc=2, **LONG, **{"parallelism.dp_shard": 2})
    pipes, messages = pipes_env(tmp_path)
    # Rank 1 is slowed on purpose: steps last long enough to signal mid-run, and the
    # per-rank timings must show it (the straggler detector's input).
    env = env_for(ws.home, FM_FAULT_SLOW_RANKS="1:0.25", **pipes)
    proc = _start(torchrun_cmd(2, "-m", "fm_pipeline.train", "--job", str(job)), env)
    _wait_for_step(ws, "preempt-sigterm", 3, proc)
    proc.send_signal(signal.SIGTERM)  # torchrun forwards it to every worker
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0  # torchrun reports a signalled agent; the code is the worker's
    segment = _assert_preempted_with_valid_checkpoint(ws, "preempt-sigterm", job)
    assert segment["preempt_reason"] == "signal SIGTERM"

    got = read_messages(messages)
    assert [m["method"] for m in got].count("opened") == 1  # only global rank 0 speaks Pipes
    (custom,) = [m for m in got if m["method"] == "report_custom_message"]
    assert custom["params"]["payload"]["segment"]["exit_reason"] == "preempted"

    from fm_pipeline.rundir.records import read_records

    timings = read_records(ws.home / "runs" / "preempt-sigterm" / "rank_timings.jsonl")
    last = {r["rank"]: r for r in timings if r["step"] == 3}
    assert last[1]["compute_s"] > last[0]["compute_s"] + 0.2
    assert last[0]["collective_wait_s"] > last[1]["collective_wait_s"] + 0.2


def test_flag_file_preempts_a_single_process_with_exit_75_and_the_next_segment_resumes(
        workspace, tmp_path):
    ws = workspace
    job = write_job(ws.jobs, "preempt-flag", nproc=1, **LONG)
    flag = tmp_path / "PREEMPT"
    env = env_for(ws.home, FM_PREEMPT_FILE=str(flag), FM_FAULT_SLOW_RANKS="0:0.2")
    proc = _start([sys.executable, "-m", "fm_pipeline.train", "--job", str(job)], env)
    _wait_for_step(ws, "preempt-flag", 2, proc)
    flag.touch()  # what a Kubernetes preStop hook does
    proc.communicate(timeout=120)
    assert proc.returncode == exit_codes.PREEMPTED
    segment = _assert_preempted_with_valid_checkpoint(ws, "preempt-flag", job)
    assert "flag file" in segment["preempt_reason"]
    assert not flag.exists()  # honoured once, so the next segment runs

    stopped_at = segment["end_step"]
    out = train(ws.home, job, "--end-step", str(stopped_at + 2),
                env=env_for(ws.home, FM_PREEMPT_FILE=str(flag)))
    assert out.returncode == 0, failure(out)
    resumed = ws.segments("preempt-flag")[-1]
    assert resumed["start_step"] == stopped_at and resumed["end_step"] == stopped_at + 2
    assert resumed["resharded"] is False and resumed["exit_reason"] == "completed"
