"""Invalid layouts and clusters are rejected with the flag at fault named."""

from __future__ import annotations

import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.shape import named_shape

SHAPE = named_shape("llama3-8b", seq_len=8192)  # 32 heads, 8 kv heads, 32 layers
H100 = make_cluster("h100")


@pytest.mark.parametrize("layout,batch,flag,words", [
    (Layout(tp=3, dp=1), 8192, "--tp", "must divide heads"),
    (Layout(tp=16, dp=1), 8192 * 4, "--tp", "kv_heads"),
    (Layout(pp=64, dp=1), 8192 * 64, "--pp", "every pipeline chunk needs a layer"),
    (Layout(pp=4, dp=2), 8192 * 4, "--micro-batch", "cannot fill a pipeline"),
    (Layout(dp=3), 8192 * 4, "--micro-batch", "does not split"),
    (Layout(dp=1), 8000, "--global-batch-tokens", "whole number of sequences"),
    (Layout(dp=2, virtual_stages=2), 8192 * 4, "--virtual-stages", "needs pp > 1"),
    (Layout(pp=4, dp=1, virtual_stages=2), 8192 * 6, "--virtual-stages", "divisible by pp"),
    (Layout(cp=3, dp=1), 8192, "--cp", "must divide seq_len"),
    (Layout(dp=1, recompute="some"), 8192, "--recompute", "none, norm_act, op, selective, half, full"),
    (Layout(dp=1, sharding="zero4"), 8192, "--sharding", "ddp, zero1"),
])
def test_bad_layouts_name_the_flag(layout, batch, flag, words):
    with pytest.raises(PlanInputError) as e:
        estimate(SHAPE, H100, layout, global_batch_tokens=batch)
    assert e.value.flag == flag and words in e.value.detail


@pytest.mark.parametrize("kwargs,flag", [
    ({"gpu_type": "tpu-v9"}, "--gpu-type"),
    ({"gpu_type": "h100", "inter_node_gbps": -1}, "--inter-node-gbps"),
    ({"gpu_type": "h100", "oversubscription": 0.5}, "--oversubscription"),
    ({"gpu_type": "h100", "gpus_per_node": 0}, "--gpus-per-node"),
    ({"gpu_type": "h100", "node_failure_rate_per_day": -0.1}, "--node-failure-rate-per-day"),
])
def test_bad_clusters_name_the_flag(kwargs, flag):
    with pytest.raises(PlanInputError) as e:
        make_cluster(**kwargs)
    assert e.value.flag == flag


def test_bad_budgets_name_the_flag():
    with pytest.raises(PlanInputError, match="training_tokens"):
        estimate(SHAPE, H100, Layout(dp=1), global_batch_tokens=8192, training_tokens=-5)
    with pytest.raises(PlanInputError, match="precision"):
        estimate(SHAPE, H100, Layout(dp=1), global_batch_tokens=8192, precision="fp4")


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_naming_both():
    with pytest.raises(PlanInputError) as e:
        estimate(SHAPE, make_cluster("a100"), Layout(dp=1), global_batch_tokens=8192,
                 precision="fp8")
    assert e.value.flag == "--precision"
    assert "fp8-tensorwise" in str(e.value) and "a100-80gb" in str(e.value)
