"""Memory per GPU: Korthikanti's activation formulas, sharding, pipelines, and whether
published configurations fit."""

from __future__ import annotations

import numpy as np
import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import Candidates, Layout
from fm_pipeline.planner.memory import layer_activations, memory_per_gpu
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import named_shape

H100 = make_cluster("h100")
BATCH_405B = 16 * 2**20  # Llama 3: 16M tokens per step


def one(layout: Layout) -> Candidates:
    return Candidates.from_layouts([layout])


@pytest.mark.parametrize("tp", [1, 8])
def test_activations_per_layer_follow_korthikanti_table_2(tp):
    shape = named_shape("gpt3-175b")  # GPT: dropout, no flash attention
    s, b, h, a = 2048, 2, shape.hidden, shape.heads
    acts = layer_activations(shape, one(Layout(tp=tp, micro_batch=b)), dtype_bytes=2)
    sbh = s * b * h
    assert acts.linear + acts.core == pytest.approx(sbh * (34 + 5 * a * s / h) / tp)  # eq. 4
    assert acts.linear == pytest.approx(34 * sbh / tp)  # selective recomputation, eq. 6
    assert acts.layer_input == pytest.approx(2 * sbh / tp)  # full recomputation (with SP)


def test_flash_attention_and_gqa_shrink_llama_activations():
    shape = named_shape("llama3-70b", seq_len=8192)
    acts = layer_activations(shape, one(Layout(tp=8)), dtype_bytes=2)
    assert acts.core == 0  # flash attention stores no s x s scores
    s, h, kv, f = 8192, 8192, 1024, 28672
    assert acts.linear == pytest.approx(s * (4 * h + 6 * h + 4 * kv + 2 * h + 8 * f) / 8)


def test_first_pipeline_stage_holds_l_layers_of_activations_whatever_pp():
    shape = named_shape("megatron-1t")
    mems = [memory_per_gpu(shape, one(Layout(tp=8, pp=pp, dp=1, recompute="none")),
                           global_batch_tokens=512 * 2048, capacity_gib=80).activations[0]
            for pp in (16, 32, 64)]
    assert mems[0] == pytest.approx(mems[2], rel=0.01)  # p stages x L/p layers = L
    interleaved = memory_per_gpu(shape, one(Layout(tp=8, pp=16, dp=1, virtual_stages=2)),
                                 global_batch_tokens=512 * 2048, capacity_gib=80).activations[0]
    assert interleaved / mems[0] == pytest.approx(1 + 15 / (16 * 2), rel=0.01)


def test_optimizer_sharding_divides_state_by_the_shard_group():
    shape = named_shape("llama3-8b", seq_len=4096)
    c = Candidates.from_layouts(
        [Layout(dp=64, sharding=s) for s in ("ddp", "zero1", "zero2", "fsdp")]
    )
    m = memory_per_gpu(shape, c, global_batch_tokens=64 * 4096, capacity_gib=80)
    assert m.optimizer[1] == pytest.approx(m.optimizer[0] / 64)
    assert m.grads[2] == pytest.approx(m.grads[1] / 64)
    assert m.weights[3] == pytest.approx(m.weights[2] / 64)
    assert list(np.diff(m.total_gib)) == sorted(np.diff(m.total_gib))  # each level saves more


def test_llama3_405b_published_layout_fits_on_h100():
    # Llama 3 405B: tp8 pp16 dp128 on 16,384 H100 80GB, 8K sequences, micro-batch 1.
    shape = named_shape("llama3-405b", seq_len=8192)
    est = estimate(
        shape,
        H100,
        Layout(tp=8, pp=16, dp=128, virtual_stages=4, recompute="full"),
        global_batch_tokens=BATCH_405B,
    )
    assert est.fits
    assert 20 < est.metrics["memory_gib_per_gpu"] < 80
    without = estimate(
        shape,
        H100,
        Layout(tp=8, pp=16, dp=128, virtual_stages=4, recompute="none"),
        global_batch_tokens=BATCH_405B,
    )
    assert not without.fits  # storing every activation of 16 in-flight micro-batches does not


def test_405b_without_model_parallelism_does_not_fit_in_80_gb():
    shape = named_shape("llama3-405b", seq_len=8192)
    ddp = estimate(
        shape,
        H100,
        Layout(dp=2048, recompute="full", sharding="ddp"),
        global_batch_tokens=BATCH_405B,
    )
    assert ddp.metrics["memory_gib"]["weights"] > 700  # 405B x 2 bytes on every GPU
    assert not ddp.fits
    none_fit = search(
        shape, H100, gpus=2048, global_batch_tokens=BATCH_405B, fixed={"tp": 1, "pp": 1, "cp": 1}
    )
    assert none_fit.evaluated > 0 and none_fit.fitting == 0
