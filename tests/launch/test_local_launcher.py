"""The local launcher reports the worker's real exit code and reason, never just torchrun's 1."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from fm_pipeline.config import parse_job
from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.launch.local import descendants, run_segment_locally, segment_command, stop
from fm_pipeline.launch.outcome import Outcome, SegmentFailed, SegmentPreempted
from fm_pipeline.launch.spec import SegmentLaunch
from tests.launch.conftest import TINY_WORKER
from tests import local_site

pytestmark = pytest.mark.slow


def _run(job, monkeypatch, behaviour: str, **kwargs):
    monkeypatch.setenv("FM_TINY_WORKER", behaviour)
    launch = SegmentLaunch(job, end_step=5, module=TINY_WORKER)
    return run_segment_locally(launch, echo=None, timeout_s=kwargs.pop("timeout_s", 120),
                               **kwargs, site=local_site.site())


def test_success_writes_the_result_next_to_the_segment(job2, monkeypatch, fm_home):
    result = _run(job2, monkeypatch, "ok")
    assert result.ok and result.exit_code == 0 and result.torchrun_exit_code == 0
    segment = Path(result.segment_dir)
    assert segment.parent == fm_home / "runs" / "tiny" / "segments"
    assert json.loads((segment / "result.json").read_text())["outcome"] == "succeeded"
    # The segment trains with the resolved spec it was launched with, kept beside its logs.
    assert parse_job(yaml.safe_load((segment / "job.yaml").read_text())) == job2
    assert "tiny worker rank 1/2: ok" in Path(result.output_log).read_text()


def test_a_crash_reports_the_exception_and_rank_not_code_1(job2, monkeypatch):
    result = _run(job2, monkeypatch, "crash")
    assert result.torchrun_exit_code == 1
    assert result.outcome is Outcome.FAILED and result.exit_code == 1
    assert result.reason == "RuntimeError: boom at step 3 of 5"
    assert result.failed_rank == 1
    assert "tiny_worker.py" in result.traceback
    with pytest.raises(SegmentFailed, match="rank 1.*boom at step 3"):
        result.raise_for_outcome()


def test_a_deliberate_exit_code_survives_torchrun(job2, monkeypatch):
    result = _run(job2, monkeypatch, "bad_config")
    assert result.torchrun_exit_code == 1
    assert result.outcome is Outcome.BAD_CONFIG and result.exit_code == 2
    assert "seq_len 4096" in result.reason


def test_a_worker_killed_by_a_signal_is_named_from_torchruns_summary(job2, monkeypatch):
    result = _run(job2, monkeypatch, "sigkill")
    assert result.outcome is Outcome.KILLED and result.exit_code == -9
    assert result.failed_rank == 1 and "SIGKILL" in result.reason
    assert result.evidence == "torchrun summary"


def _when_ready(segment: Path, action) -> threading.Thread:
    """Run `action` once both ranks of the preempt behaviour have installed their handlers."""

    def wait():
        log = segment / "torchrun.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.is_file() and log.read_text().count("ready") == 2:
                action()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_preempting_a_segment_sends_sigterm_so_ranks_checkpoint(job2, monkeypatch, tmp_path):
    segment, preempt = tmp_path / "segment", threading.Event()
    _when_ready(segment, preempt.set)
    result = _run(job2, monkeypatch, "preempt", segment_dir=segment, preempt=preempt)
    assert result.outcome is Outcome.PREEMPTED and result.torchrun_exit_code != 0
    assert result.exit_code == 75 and "preempted (SIGTERM)" in result.reason
    with pytest.raises(SegmentPreempted):
        result.raise_for_outcome()


def test_a_segment_past_its_time_limit_is_stopped_and_says_so(job2, monkeypatch):
    result = _run(job2, monkeypatch, "preempt", timeout_s=1)
    assert result.outcome is Outcome.TIMED_OUT and result.exit_code != 0
    assert result.reason.startswith("stopped after the 1 s time limit")


def test_the_real_trainer_preempted_by_the_flag_file_checkpoints_and_says_so(tmp_path,
                                                                           fm_home):
    """The launcher's flag file and the trainer's preemption agree: exit 75, a checkpoint."""
    job = small_job(**{"name": "real", "parallelism.nproc_per_node": 2, "training.steps": 40,
                       "training.segment_steps": 40, "checkpoint.every_steps": 100,
                       "checkpoint.upload": False})
    build_small_mix(job, store=local_site.site().store())
    segment = tmp_path / "segment"

    def touch_after_step_2():
        log = segment / "torchrun.log"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if log.is_file() and "step 2:" in log.read_text():
                (segment / "preempt").touch()
                return
            time.sleep(0.1)

    threading.Thread(target=touch_after_step_2, daemon=True).start()
    result = run_segment_locally(SegmentLaunch(job, end_step=40), segment_dir=segment,
                                 echo=None, timeout_s=300, site=local_site.site())
    assert result.outcome is Outcome.PREEMPTED and result.exit_code == 75, result.reason
    assert "preempted" in result.reason
    committed = sorted((fm_home / "runs" / "real" / "checkpoints").glob("step-*/manifest.json"))
    assert committed, "no checkpoint committed before the preempted exit"
    assert 2 <= int(committed[-1].parent.name.removeprefix("step-")) < 40


def test_stopping_kills_workers_that_ignore_sigterm_even_if_torchrun_dies(job2, tmp_path):
    """Workers run in sessions of their own: killing torchrun's group would orphan them."""
    out = tmp_path / "out"
    out.mkdir()
    argv, paths = segment_command(SegmentLaunch(job2, end_step=5, module=TINY_WORKER), local_site.site(),
                                  tmp_path / "segment")
    env = {**os.environ, **paths.env(), "FM_TINY_WORKER": "ignore_sigterm",
           "FM_TINY_OUT": str(out)}
    proc = subprocess.Popen(argv, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(out.glob("pid*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [int(p.read_text()) for p in out.glob("pid*")]
    assert len(workers) == 2 and all(pid in descendants(proc.pid) for pid in workers)
    stop(proc, grace_s=0.5)  # shorter than torchrun's own shutdown timeout: it gets SIGKILL
    time.sleep(0.5)
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), f"worker {pid} lives"


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
