"""Predicted vs measured after a segment."""

from __future__ import annotations

import pytest

from fm_pipeline.planner.compare import compare_with_measured, steady_step_time
from fm_pipeline.planner.errors import PlanInputError


def test_steady_step_time_skips_warmup_and_takes_the_median():
    assert steady_step_time([9.0, 5.0, 1.0, 1.2, 1.1, 30.0], warmup=2) == pytest.approx(1.15)
    assert steady_step_time([2.0], warmup=2) == 2.0


def test_a_run_close_to_the_plan_is_within_tolerance():
    cmp = compare_with_measured(predicted_step_time_s=1.0, predicted_mfu=0.40,
                                measured_step_time_s=1.1, measured_mfu=0.36)
    assert cmp.within_tolerance
    assert cmp.step_time_error == pytest.approx(0.1) and cmp.mfu_error == pytest.approx(-0.1)
    assert "within 25%" in cmp.verdict


def test_a_slow_run_points_at_what_to_look_at():
    cmp = compare_with_measured(
        predicted_step_time_s=1.0, predicted_mfu=0.4, measured_step_time_s=2.0
    )
    assert not cmp.within_tolerance and cmp.mfu_error is None
    assert "100% slower than planned" in cmp.verdict and "stragglers" in cmp.verdict
    assert cmp.to_dict()["measured_step_time_s"] == 2.0


def test_nonsense_measurements_are_rejected_by_name():
    with pytest.raises(PlanInputError, match="measured_step_time_s"):
        compare_with_measured(predicted_step_time_s=1.0, predicted_mfu=0.4, measured_step_time_s=0)
    with pytest.raises(PlanInputError, match="step_times_s"):
        steady_step_time([])
