"""The job plan carries the fast tier's interval next to the configured one."""

from __future__ import annotations

from fm_pipeline.data.testing import small_job
from fm_pipeline.planner.job_plan import plan_for_job


def test_a_multi_node_plan_recommends_a_fast_interval_and_one_node_none():
    two = plan_for_job(small_job(**{"parallelism.nnodes": 2, "parallelism.nproc_per_node": 2,
                                    "checkpoint.memory_every_steps": 3}), alternatives=1)
    ck = two["checkpoint"]
    assert ck["configured_memory_every_steps"] == 3
    assert ck["recommended_memory_every_steps"] >= 1
    assert ck["recommended_every_steps_with_memory"] >= ck["recommended_memory_every_steps"]
    assert two["estimate"]["fast_tier"]["goodput"] == ck["goodput_with_memory"]
    one = plan_for_job(small_job(**{"parallelism.nproc_per_node": 2}), alternatives=1)
    assert one["checkpoint"]["recommended_memory_every_steps"] is None
