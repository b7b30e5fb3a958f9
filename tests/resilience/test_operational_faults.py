"""The fault matrix's operational faults (fm_pipeline.resilience.scenarios.operations) run as
`fm chaos run` runs them: `fm api serve` SIGKILLed between submitting a run and recording it,
its dagster-daemon SIGKILLed mid-segment, and a trainer elsewhere whose wall clock runs
120 s ahead. Every check holds, and each reported figure agrees with the job's records."""

from __future__ import annotations

import pytest

from fm_pipeline.resilience.matrix import run_fault
from tests.resilience.records_check import assert_figures_agree

pytestmark = [pytest.mark.slow, pytest.mark.server]


@pytest.mark.parametrize("fault", ["api-kill-submit", "daemon-kill", "clock-skew"])
def test_operational_fault(chaos_ws, fault):
    result = run_fault(chaos_ws, fault)
    if result.skipped:  # libfaketime or a UTS namespace missing: the fault was not injected
        pytest.fail(f"{fault} could not be injected here: {result.skipped}")
    assert result.passed, (result.error, result.outcome, result.failed_checks())
    assert result.steps_lost == 0, result.outcome
    with chaos_ws.active():
        assert_figures_agree(result, chaos_ws.site.runs_dir(result.job))
    if fault == "api-kill-submit":  # the daemon started the run the killed server submitted
        assert result.resume_s is not None and result.resume_s > 0
