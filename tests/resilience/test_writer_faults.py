"""The fault matrix's writer faults (fm_pipeline.resilience.scenarios.writers) run as
`fm chaos run` runs them, each in a real 2-rank run: every check holds, and each reported
figure agrees with the run's own records."""

from __future__ import annotations

import pytest

from fm_pipeline.resilience.matrix import run_fault
from tests.resilience.records_check import assert_figures_agree

pytestmark = pytest.mark.slow

JOBS = {"ckpt-corrupt-both-tiers": "chaos-both-tiers", "second-trainer": "chaos-two-trainers",
        "read-only-ckpt": "chaos-read-only"}


@pytest.mark.parametrize("fault", list(JOBS))
def test_writer_fault(chaos_ws, fault):
    result = run_fault(chaos_ws, fault)
    if result.skipped:  # e.g. no read-only mount without root: the fault was not injected
        pytest.fail(f"{fault} could not be injected here: {result.skipped}")
    assert result.passed, (result.error, result.outcome, result.failed_checks())
    with chaos_ws.active():  # the table's figures are the records' figures
        assert_figures_agree(result, chaos_ws.site.runs_dir(JOBS[fault]))
    if fault == "second-trainer":  # refused at once, and nothing trained twice
        assert result.steps_lost == 0 and 0 < result.detect_s < 60
