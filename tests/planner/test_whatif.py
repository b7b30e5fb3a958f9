"""What-if sweeps: what breaks first at 2x GPUs, batch limits, regions, bandwidth, failures."""

from __future__ import annotations

import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.shape import named_shape
from fm_pipeline.planner.whatif import what_if


@pytest.fixture(scope="module")
def llama3_8k():
    # Llama 3 405B's 8K-GPU stage: tp8 pp16 dp64, 16M-token batches; a 16K-GPU region.
    cluster = make_cluster("h100", region_gpus=16384, node_failure_rate_per_day=0.0038,
                           storage_write_gbps=500)
    return what_if(named_shape("llama3-405b", seq_len=8192), cluster, gpus=8192,
                   global_batch_tokens=16 * 2**20, training_tokens=15.6e12, doublings=2,
                   layout=Layout(tp=8, pp=16, dp=64, virtual_stages=4, recompute="half"))


def rows(wi):
    return {r["scenario"]: r for r in wi.rows()}


def test_doubling_gpus_at_a_fixed_batch_grows_the_bubble_first(llama3_8k):
    assert llama3_8k.breaks_first.startswith("pipeline bubble")
    r = rows(llama3_8k)
    assert r["2x GPUs, dp x2"]["bubble_fraction"] > r["baseline"]["bubble_fraction"]
    assert r["2x GPUs, dp x2"]["mfu"] < r["baseline"]["mfu"]
    assert r["2x GPUs, dp x2"]["time_to_train_days"] < r["baseline"]["time_to_train_days"]
    assert r["2x GPUs, dp x2"]["goodput"] < r["baseline"]["goodput"]  # twice the failures


def test_the_layout_breaks_when_the_batch_cannot_fill_the_pipeline(llama3_8k):
    r = rows(llama3_8k)
    assert r["4x GPUs, dp x4"]["layout"] is None
    assert "cannot fill a pipeline" in r["4x GPUs, dp x4"]["note"]
    assert r["4x GPUs, re-planned"]["layout"] is not None


def test_outgrowing_a_region_is_flagged(llama3_8k):
    r = rows(llama3_8k)
    assert r["4x GPUs, re-planned"]["crosses_regions"] == ["dp"]
    assert "crosses regions" in r["4x GPUs, re-planned"]["note"]
    assert r["2x GPUs, re-planned"]["crosses_regions"] == []


def test_fabric_storage_and_failure_sweeps_move_the_right_numbers(llama3_8k):
    r = rows(llama3_8k)
    base = r["baseline"]
    assert r["fabric x0.5"]["step_time_s"] > base["step_time_s"] > r["fabric x2"]["step_time_s"]
    assert r["failures x2"]["goodput"] < base["goodput"] < r["failures x0.5"]["goodput"]
    assert r["storage x0.5"]["step_time_s"] == base["step_time_s"]
    assert r["storage x0.5"]["goodput"] <= base["goodput"] <= r["storage x2"]["goodput"]
