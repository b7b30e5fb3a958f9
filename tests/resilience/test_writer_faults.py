"""The fault matrix's writer faults (fm_pipeline.resilience.scenarios.writers) run as
`fm chaos run` runs them, each in a real 2-rank run: every check holds, and each reported
figure agrees with the run's own records."""

from __future__ import annotations

import pytest

from fm_pipeline.resilience.matrix import run_fault
from fm_pipeline.resilience.scenarios.common import steps_trained_twice

pytestmark = pytest.mark.slow

JOBS = {"ckpt-corrupt-both-tiers": "chaos-both-tiers", "second-trainer": "chaos-two-trainers",
        "read-only-ckpt": "chaos-read-only"}


@pytest.mark.parametrize("fault", list(JOBS))
def test_writer_fault(chaos_ws, fault):
    result = run_fault(chaos_ws, fault)
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.passed, (result.error, result.outcome, result.failed_checks())
    with chaos_ws.active():  # the table's figure is the records' figure
        assert result.steps_lost == steps_trained_twice(JOBS[fault])
