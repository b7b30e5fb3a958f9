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


def test_a_store_too_slow_for_the_loader_is_what_breaks_first():
    """The loader reads every token once: tokens/s x 2 bytes (uint16 ids, 128K vocabulary
    -> uint32: 4) against the store's read bandwidth. Text is light (Llama 3 8B on 64 H100s
    reads ~2 MB/s): a store reading 3 MB/s feeds it, not twice as many GPUs; the estimate
    warns and what-if names it."""
    from fm_pipeline.planner.estimate import estimate

    shape = named_shape("llama3-8b", seq_len=8192)
    slow = make_cluster("h100", storage_read_gbps=0.003)
    layout = Layout(tp=1, dp=64, micro_batch=1, recompute="full")
    est = estimate(shape, slow, layout, global_batch_tokens=4 * 2**20)
    reads = est.data
    assert reads.needed_gbps == pytest.approx(
        est.metrics["tokens_per_s"] * 4 * 8193 / 8192 / 1e9)
    assert reads.available_gbps == 0.003 and 0.5 < reads.share < 1
    assert not any("data loader" in w for w in est.warnings)
    assert est.to_dict()["data_reads"]["share"] == pytest.approx(reads.share)
    wi = what_if(shape, slow, gpus=64, global_batch_tokens=4 * 2**20, layout=layout,
                 doublings=1)
    assert wi.breaks_first.startswith("data reads:"), wi.breaks_first
    assert "of the store's read bandwidth" in wi.breaks_first
    doubled = rows(wi)["2x GPUs, dp x2"]
    assert doubled["data_read_share"] > 1
    bigger = estimate(shape, slow, Layout(tp=1, dp=128, micro_batch=1, recompute="full"),
                      global_batch_tokens=4 * 2**20)
    assert any(w.startswith("the data loader would stall") for w in bigger.warnings)
