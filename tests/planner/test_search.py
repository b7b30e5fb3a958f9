"""The parallelism search: valid, fitting, ranked, explained."""

from __future__ import annotations

import numpy as np
import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.layout import RECOMPUTE, check_layout
from fm_pipeline.planner.runnable import not_runnable, runnable_mask
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import named_shape

H100 = make_cluster("h100")


@pytest.fixture(scope="module")
def one_trillion():
    shape = named_shape("dense-1t", seq_len=8192)
    return shape, search(shape, H100, gpus=16384, global_batch_tokens=16 * 2**20, top=5)


def test_1t_on_16k_gpus_finds_fitting_plans_ranked_by_throughput(one_trillion):
    shape, result = one_trillion
    assert result.evaluated > 10_000 and 0 < result.fitting < result.evaluated
    tokens = [result.metrics(p.index)["tokens_per_s"] for p in result.plans]
    assert tokens == sorted(tokens, reverse=True)
    runnable = runnable_mask(shape, result.candidates)
    ev = result.evaluation
    assert tokens[0] == pytest.approx(ev.tokens_per_s[ev.fits & runnable].max())
    for p in result.plans:
        m = result.metrics(p.index)
        assert m["fits"] and m["memory_gib_per_gpu"] <= 80
        check_layout(shape, p.layout, gpus=16384, global_batch_tokens=16 * 2**20)
        # 1T of training state (~18 TB) cannot live on fewer than 64-way splits of it.
        sharded = p.layout.shard_group if p.layout.sharding == "fsdp" else 1
        assert p.layout.tp * p.layout.pp * sharded >= 64
        assert not_runnable(shape, p.layout) == []


def test_the_best_plan_says_why(one_trillion):
    _, result = one_trillion
    reasons = " / ".join(result.plans[0].reasons)
    lay = result.plans[0].layout
    assert f"tp={lay.tp}" in reasons and f"pp={lay.pp}" in reasons
    assert "NVLink" in reasons or "fabric" in reasons
    # pp below the chosen one is either slower or does not fit, and the reason says which.
    assert "smaller pp" in reasons or "do not fit" in reasons


def test_pinned_fields_are_respected():
    shape = named_shape("llama3-70b", seq_len=8192)
    result = search(shape, H100, gpus=512, global_batch_tokens=4 * 2**20,
                    fixed={"tp": 8, "recompute": "full", "sharding": "fsdp"})
    c = result.candidates
    assert set(c.tp) == {8} and set(c.recompute) == {RECOMPUTE.index("full")} and len(result.plans) > 0
    assert {p.layout.sharding for p in result.plans} == {"fsdp"}


def test_a_small_model_on_one_node_needs_no_pipeline():
    shape = named_shape("llama3-8b", seq_len=8192)
    best = search(shape, H100, gpus=8, global_batch_tokens=64 * 8192, top=1).plans[0].layout
    # Op-level selective checkpointing (torchtitan's choice for 8B at 8K) or less/more.
    assert best.pp == 1 and best.recompute in ("none", "op", "half")


def test_nothing_fits_is_an_empty_ranking_not_an_error():
    shape = named_shape("llama3-405b", seq_len=8192)
    result = search(shape, H100, gpus=8, global_batch_tokens=16 * 8192)
    assert result.plans == [] and result.fitting == 0 and result.evaluated > 0
    assert not np.any(result.evaluation.fits)


def test_impossible_pins_name_the_problem():
    shape = named_shape("llama3-8b", seq_len=8192)
    with pytest.raises(PlanInputError, match="gpus"):
        search(shape, H100, gpus=12, global_batch_tokens=8192 * 12, fixed={"tp": 8})
    with pytest.raises(PlanInputError, match="global_batch_tokens"):
        search(shape, H100, gpus=8, global_batch_tokens=1000)
    with pytest.raises(PlanInputError, match="warp_size"):
        search(shape, H100, gpus=8, global_batch_tokens=8192 * 8, fixed={"warp_size": 32})
