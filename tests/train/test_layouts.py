"""Every parallelism layout the job spec accepts at 4 ranks trains: the loss falls, and all
layouts compute the same model (same initial weights, same first-step loss)."""

from __future__ import annotations

import math

import pytest

from tests.train.conftest import LAYOUTS, SAME_MODEL


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_trains_and_loss_falls(layouts_run, layout):
    steps = layouts_run.metrics(layout)
    assert [s["step"] for s in steps] == list(range(1, 9))
    first, last = steps[0]["loss"], sum(s["loss"] for s in steps[-2:]) / 2
    assert first - last > 0.5, [round(s["loss"], 3) for s in steps]
    for s in steps:
        assert math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0
        assert s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1
    (segment,) = layouts_run.segments(layout)
    assert segment["exit_reason"] == "completed" and segment["end_step"] == 8


@pytest.mark.slow
def test_all_layouts_start_from_the_same_model(layouts_run):
    """Initialisation does not depend on sharding: the first loss and gradient norm agree
    across layouts (bf16 ones to bf16 precision, FP8 ones to FP8's)."""
    first = {name: layouts_run.metrics(name)[0] for name in SAME_MODEL}
    reference = first["fsdp4"]
    for name, step in first.items():
        precision = LAYOUTS[name].get("parallelism.mixed_precision", "fp32")
        tolerance = {"fp32": 1e-5, "bf16": 2e-3}.get(precision, 1e-2)
        assert step["loss"] == pytest.approx(reference["loss"], abs=tolerance), name
        if precision == "fp32":  # same gradients, however sharded: the global norm agrees
            assert step["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5), name


@pytest.mark.slow
def test_rank_timings_cover_every_rank_with_its_pipeline_stage(layouts_run):
    from fm_pipeline.rundir.records import read_records

    records = read_records(layouts_run.home / "runs" / "pp4-bf16" / "rank_timings.jsonl")
    assert {r["step"] for r in records} == {2, 4, 6, 8}  # rank_timings_every = 2
    at_4 = sorted((r for r in records if r["step"] == 4), key=lambda r: r["rank"])
    assert [r["rank"] for r in at_4] == [0, 1, 2, 3]
    assert [r["peer_group"] for r in at_4] == [0, 1, 2, 3]  # pp rank of each
    for r in at_4:
        assert r["steps"] == 2 and r["compute_s"] > 0 and r["collective_wait_s"] >= 0
        assert r["step_time_s"] >= r["compute_s"]


@pytest.mark.slow
def test_the_moe_layout_reports_its_routing_every_step(layouts_run):
    from fm_pipeline.model import get_model_config

    cfg = get_model_config("moe-debug")
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    for s in layouts_run.metrics("moe-fsdp4"):
        # Every token of the global batch took top-k slots in every MoE layer, all ranks.
        assert s["moe_slots"] == s["tokens"] * cfg.moe_top_k * moe_layers
        assert s["moe_dropped_slots"] == 0 and 1.0 <= s["moe_max_load"] < cfg.n_experts
    assert "moe_slots" not in layouts_run.metrics("fsdp4")[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["moe-ep2", "moe-ep4", "moe-pp2-ep2"])
def test_expert_parallel_trains_the_same_model_as_plain_fsdp(layouts_run, layout):
    """Tokens dispatched to the experts' ranks and back give the forward and the gradients
    of the experts held whole: every step's loss, gradient norm and routing agree with
    moe-fsdp4 (a gradient off by the ep group's size would show in the norm). Under a
    pipeline too: each stage's balancing loss trains its routers (a dropped one would show
    in the norm), and only the step's micro-batches count as routed (not the forwards
    torch runs to infer the stages' shapes, on the first step and after an evaluation)."""
    plain, ep = layouts_run.metrics("moe-fsdp4"), layouts_run.metrics(layout)
    assert len(ep) == len(plain) == 8
    for a, b in zip(plain, ep, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4), (layout, b["step"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), (layout, b["step"])
        assert (b["moe_slots"], b["moe_dropped_slots"]) == (a["moe_slots"], a["moe_dropped_slots"])
    assert ep[0]["grad_norm"] == pytest.approx(plain[0]["grad_norm"], rel=1e-6)


@pytest.mark.slow
def test_the_routing_bias_moves_every_step_and_is_checkpointed(layouts_run):
    """Each of the 8 steps moves every expert's bias by +-0.01 (or 0 at exactly the mean
    load) from the load summed over all ranks; the checkpoint holds one per MoE layer."""
    import torch

    from fm_pipeline.checkpoint import load_full_state

    state = load_full_state(layouts_run.checkpoint("moe-bias", 8), keys={"model"})["model"]
    biases = {k: v for k, v in state.items() if k.endswith("expert_bias")}
    assert len(biases) == 4, sorted(state)[:8]  # moe-debug: every layer is MoE
    for name, bias in biases.items():
        assert bias.shape == (8,) and 0 < bias.abs().max() <= 8 * 0.01 + 1e-6, (name, bias)
        steps = bias / 0.01  # a whole number of +-1 moves per expert
        assert torch.allclose(steps, steps.round(), atol=1e-3), (name, bias)
    assert "moe_slots" in layouts_run.metrics("moe-bias")[0]
