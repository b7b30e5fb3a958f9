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


def test_demo_runs_the_whole_pipeline_and_reports_it(fm_home):
    env = {**os.environ, "FM_HOME": str(fm_home), "DAGSTER_HOME": str(fm_home / "dagster"),
           "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "fm_pipeline.cli.main", "demo",
                          "--backoff-s", "0.5"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
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
