"""`fm demo` (= `make demo`) as a user runs it: the whole pipeline on the embedded
defaults in a fresh FM_HOME, and a report that says what happened."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


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


def test_demo_runs_the_whole_pipeline_through_the_daemon_and_reports_it(fm_home):
    """Started in the background the way CI runners and nohup start it (a non-interactive
    shell's `&` leaves SIGINT ignored): every run is launched by the demo's dagster-daemon,
    which is stopped with everything it started when the demo ends."""
    env = {**os.environ, "FM_HOME": str(fm_home), "DAGSTER_HOME": str(fm_home / "dagster"),
           "COLUMNS": "200"}
    command = f"{sys.executable} -m fm_pipeline.cli.main demo --backoff-s 0.5 & wait $!"
    out = subprocess.run(["sh", "-c", command], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert not _processes_of(fm_home), _processes_of(fm_home)
    daemon_log = (fm_home / "dagster" / "services" / "daemon.log").read_text()
    assert "run_intake_sensor" in daemon_log and "segment_failure_sensor" in daemon_log
    # the data mix: both domains, what was dropped, Dagster's checks
    assert re.search(r"^ code +0\.6 ", text, re.M) and re.search(r"^ prose +0\.4 ", text, re.M)
    assert re.search(r"checks: (\d+)/\1 passed", text)
    # training: three segments, the injected failure, the sensor's resume, the target step
    assert re.search(r"20->40 +next_segment +failed at step 35", text)
    assert "segment_failure_sensor -> resumed" in text
    assert re.search(r"30->40 +resume_after_failure +completed", text)
    assert "demo-1: step 60/60 in 4 segment launches (1 resumed)" in text
    # every checkpoint evaluated per domain, the drill on another topology passed
    for step in (10, 20, 30, 40, 50, 60):
        assert re.search(rf"^ +{step} +\d+\.\d+ / \d+ +\d+\.\d+ / \d+", text, re.M), step
    assert "passed: world 2 (dp_shard 2) -> world 1" in text
    figure = fm_home / "runs" / "demo-1" / "training.png"
    assert figure.stat().st_size > 10_000 and str(figure) in text.replace("\n", "")


def test_the_moe_demo_trains_expert_parallel_through_the_same_pipeline(fm_home):
    """configs/demo-moe.yaml: moe-tiny with its experts over 2 ranks (ep 2), the injected
    failure resumed by the sensor, drills restoring the expert-parallel checkpoints on one
    process, and the router's load in the report."""
    env = {**os.environ, "FM_HOME": str(fm_home), "DAGSTER_HOME": str(fm_home / "dagster"),
           "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "fm_pipeline.cli.main", "demo", "--job", "configs/demo-moe.yaml",
         "--backoff-s", "0.5"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
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
