"""Mixture of Experts in the planner: expert memory split by ep, the all-to-all's cost by
where the ep group reaches, expert GEMMs that lose efficiency as experts shrink, ep in the
search and its explanation, and the refusals that name the field."""

from __future__ import annotations

import dataclasses

import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.collectives import LEVEL_NAMES
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.layout import RECOMPUTE, Candidates, Layout, check_layout, parse_layout
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import named_shape
from fm_pipeline.planner.step import evaluate

H100 = make_cluster("h100")
MIXTRAL = named_shape("mixtral-8x7b", seq_len=4096)
DEEPSEEK = named_shape("deepseek-v3-like", seq_len=4096)


def _eval(shape, layouts, batch):
    return evaluate(shape, H100, Candidates.from_layouts(layouts), global_batch_tokens=batch)


def test_expert_state_on_a_gpu_shrinks_with_ep_where_it_is_not_sharded_anyway():
    batch = 64 * 4096
    lay = [Layout(dp=64, ep=ep, sharding="zero1", recompute="full") for ep in (1, 2, 8)]
    ev = _eval(MIXTRAL, lay, batch)
    held = ev.memory.weights + ev.memory.grads  # ZeRO-1 keeps both whole
    experts = MIXTRAL.params().routed
    # Going from ep 1 to ep 8 drops 7/8 of the experts' 2 + 4 bytes per parameter.
    assert held[0] - held[2] == pytest.approx(experts * (1 - 1 / 8) * 6, rel=1e-6)
    assert held[0] > held[1] > held[2]
    # Under FSDP the state is sharded over all dp either way; what ep shrinks is the layer
    # FSDP gathers (its local experts only).
    fsdp = _eval(MIXTRAL, [dataclasses.replace(x, sharding="fsdp") for x in lay], batch)
    assert fsdp.memory.optimizer[0] == pytest.approx(fsdp.memory.optimizer[2])
    assert fsdp.memory.working[0] > fsdp.memory.working[1] > fsdp.memory.working[2]


def test_the_all_to_all_is_free_at_ep_1_and_costs_more_once_it_leaves_the_node():
    batch = 2048 * 4096
    ev = _eval(DEEPSEEK, [Layout(dp=2048, ep=ep, sharding="fsdp", recompute="full")
                          for ep in (1, 8, 16)], batch)
    assert ev.ep_comm_s[0] == 0
    assert [LEVEL_NAMES[int(x)] for x in ev.ep_level[1:]] == ["node", "leaf"]
    # Twice the group, the same bytes per rank: over the NIC (50 GB/s) instead of NVLink.
    assert ev.ep_comm_s[2] > 3 * ev.ep_comm_s[1]


def test_an_imbalanced_router_slows_the_step_through_the_busiest_rank():
    batch = 64 * 4096
    lay = [Layout(dp=64, ep=8, sharding="fsdp", recompute="full")]
    even = _eval(dataclasses.replace(MIXTRAL, expert_imbalance=1.0), lay, batch)
    skewed = _eval(dataclasses.replace(MIXTRAL, expert_imbalance=1.5), lay, batch)
    assert skewed.step_time_s[0] > even.step_time_s[0]
    # The bytes scale by 1.5; the all-to-all's fixed latency does not.
    assert 1.4 * even.ep_comm_s[0] < skewed.ep_comm_s[0] < 1.5 * even.ep_comm_s[0]
    assert skewed.mfu[0] < even.mfu[0]  # same model FLOPs, longer step


def test_many_small_experts_run_below_the_rate_of_one_dense_mlp_of_the_same_flops():
    """Expert GEMMs get top_k x tokens x ep / experts rows each: fewer rows, lower rate."""
    batch = 8 * 4096
    few = dataclasses.replace(MIXTRAL, experts=8, top_k=2, expert_ffn=14336)
    many = dataclasses.replace(MIXTRAL, experts=64, top_k=16, expert_ffn=14336 // 8)
    # The same FLOPs but for the wider router (64 logits a token instead of 8).
    assert few.model_flops_per_token() == pytest.approx(many.model_flops_per_token(), rel=1e-3)
    lay = [Layout(dp=8, sharding="fsdp", recompute="none")]
    assert _eval(many, lay, batch).compute_s[0] > _eval(few, lay, batch).compute_s[0]


def test_search_picks_ep_and_says_why():
    result = search(DEEPSEEK, H100, gpus=2048, global_batch_tokens=16384 * 4096, top=3)
    best = result.plans[0]
    assert best.layout.ep > 1 and best.layout.tp == 1  # the trainer's space: no tp with MoE
    why = " ".join(best.reasons)
    assert f"ep={best.layout.ep}: {256 // best.layout.ep} of 256 experts per GPU" in why
    assert "of the step" in why and "ep" in parse_layout(best.layout.describe()).describe()
    # Outside the trainer's space the cost model may prefer pipelines: shown apart.
    assert all("Mixture of Experts" in " ".join(p.reasons) or p.reasons
               for p in result.not_runnable)


def test_a_plan_costed_with_the_all_to_all_overlapped_is_not_what_the_trainer_runs():
    """The trainer runs experts under pipelines without Megatron's 1F1B or DualPipe
    overlap: a search costed with one has no runnable expert-parallel plan, and says why."""
    plain = search(DEEPSEEK, H100, gpus=2048, global_batch_tokens=16384 * 4096, top=1)
    assert plain.plans[0].layout.ep > 1 and plain.plans[0].layout.pp > 1
    overlapped = search(DEEPSEEK, H100, gpus=2048, global_batch_tokens=16384 * 4096, top=1,
                        ep_overlap="1f1b")
    assert all(p.layout.ep == 1 for p in overlapped.plans)
    assert any("ep_overlap 1f1b: the trainer does not overlap" in " ".join(p.reasons)
               for p in overlapped.not_runnable)


def test_a_dense_search_never_tries_ep():
    result = search(named_shape("llama3-8b", seq_len=4096), H100, gpus=64,
                    global_batch_tokens=256 * 4096, top=1)
    assert set(result.candidates.ep.tolist()) == {1}


@pytest.mark.parametrize("layout,shape,message", [
    (Layout(dp=64, ep=3, sharding="fsdp"), MIXTRAL, r"experts \(8\) must be divisible by ep"),
    (Layout(dp=64, ep=8, sharding="ddp"), MIXTRAL, "needs sharding"),
    (Layout(tp=2, dp=32, ep=16, sharding="fsdp", dp_shard=4), DEEPSEEK,
     r"ep \(16\) must divide tp x cp x the shard group \(2 x 1 x 4 = 8\)"),
    (Layout(dp=64, ep=16, sharding="fsdp", dp_shard=8), DEEPSEEK, r"ep \(16\) must divide"),
    (Layout(dp=64, ep=2, sharding="fsdp"), named_shape("llama3-8b", seq_len=4096),
     "needs a Mixture of Experts"),
])
def test_bad_ep_is_refused_naming_the_field(layout, shape, message):
    with pytest.raises(PlanInputError, match=message) as e:
        check_layout(shape, layout, gpus=64, global_batch_tokens=64 * 4096)
    assert e.value.field == "ep"


def test_the_cli_pins_ep_and_takes_a_measured_imbalance():
    import json

    from typer.testing import CliRunner

    from fm_pipeline.cli.plan import app

    common = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu-type", "h100", "--seq-len",
              "4096", "--global-batch-tokens", str(2**22), "--json"]
    out = CliRunner().invoke(app, ["search", *common, "--ep", "8", "--top", "2"])
    assert out.exit_code == 0, out.output
    plans = json.loads(out.output)["plans"]
    assert plans and all(p["layout"]["ep"] == 8 and "ep=8" in p["describe"] for p in plans)
    mfu = []
    for imbalance in ("1.0", "1.5"):
        out = CliRunner().invoke(app, ["estimate", *common, "--layout",
                                       "dp=64 ep=8 mb=2 recompute=full fsdp",
                                       "--expert-imbalance", imbalance])
        assert out.exit_code == 0, out.output
        mfu.append(json.loads(out.output)["mfu"])
    assert mfu[1] < mfu[0]


def test_node_limited_routing_sends_a_token_once_per_node_and_only_across_nodes():
    batch = 2048 * 4096
    lay = [Layout(dp=2048, ep=ep, sharding="fsdp", recompute="full") for ep in (8, 64)]
    plain = _eval(DEEPSEEK, lay, batch)
    limited = _eval(dataclasses.replace(DEEPSEEK, route_nodes=4), lay, batch)
    # Inside one node nothing crosses the network: the limit changes nothing.
    assert limited.ep_comm_s[0] == pytest.approx(plain.ep_comm_s[0])
    # Over 8 nodes: at most 4 nodes a token, one send each (7/8 of them remote), instead of
    # its 8 routed copies 56/64 of which leave the node: 3.5 against 7 sends over the NIC.
    assert limited.ep_comm_s[1] == pytest.approx(plain.ep_comm_s[1] / 2, rel=0.05)
    with pytest.raises(PlanInputError, match="route_nodes"):
        dataclasses.replace(DEEPSEEK, route_nodes=-1)


def test_an_overlapped_all_to_all_shows_only_what_outlasts_the_compute():
    batch = 2048 * 4096
    lay = Candidates.from_layouts([Layout(dp=2048, ep=64, sharding="fsdp", recompute="full")])
    exposed = evaluate(DEEPSEEK, H100, lay, global_batch_tokens=batch)
    hidden = evaluate(DEEPSEEK, H100, lay, global_batch_tokens=batch, ep_overlap=True)
    assert exposed.ep_comm_s[0] > 0
    assert hidden.ep_comm_s[0] == pytest.approx(max(0.0, exposed.ep_comm_s[0]
                                                    - exposed.compute_s[0]))
    assert hidden.step_time_s[0] < exposed.step_time_s[0]


def test_an_ep_group_stays_on_the_fewest_nodes_under_a_pipeline():
    """Megatron-Core's rank order (tp-cp-ep-dp-pp): a pipeline's stages are outermost, so
    ep 8 without tp is one node whatever pp is."""
    batch = 2048 * 4096
    ev = _eval(DEEPSEEK, [Layout(pp=16, dp=128, ep=8, sharding="zero1", recompute="full")],
               batch)
    assert LEVEL_NAMES[int(ev.ep_level[0])] == "node"


QWEN3 = named_shape("qwen3-235b-a22b", seq_len=4096)


def test_ep_folds_over_tp_and_the_ranks_left_share_the_experts_state():
    """Megatron-Core's MoE parallel folding (expert tp 1): ep consecutive ranks of a stage,
    tp innermost. Qwen3-235B's published tp 2 x dp 16 x ep 32 is a layout; ep 32 spans 4
    nodes, ep 8 one node (the tp pair and 4 data-parallel ranks), ep 2 the tp pair alone."""
    batch = 2048 * 4096
    lays = [Layout(tp=2, pp=8, dp=16, ep=ep, virtual_stages=4, sharding="zero1",
                   recompute="norm_act") for ep in (2, 8, 32)]
    for lay in lays:
        check_layout(QWEN3, lay, gpus=256, global_batch_tokens=batch)
    ev = _eval(QWEN3, lays, batch)
    assert [LEVEL_NAMES[int(x)] for x in ev.ep_level] == ["node", "node", "leaf"]
    # The experts on a GPU: experts / ep of each layer, whole (not split by tp).
    experts = QWEN3.params().routed
    layers = ev.memory.layers_per_rank[0]
    assert ev.memory.stage_expert_params[2] == pytest.approx(experts / QWEN3.layers * layers / 32)
    # ZeRO-1 shards their optimizer state over the tp x dp / ep ranks holding the same
    # experts: 16, 4, 1 ranks of experts / 2, / 8, / 32; the same bytes per GPU each time.
    assert ev.memory.optimizer[0] == pytest.approx(ev.memory.optimizer[2], rel=1e-6)
    held = ev.memory.weights + ev.memory.grads  # kept whole under ZeRO-1: shrink with ep
    assert held[0] > held[1] > held[2]


def test_norm_act_recomputation_keeps_less_than_none_for_a_little_time():
    """Megatron-Core's MoE default: the norms' outputs and the experts' SwiGLU recomputed
    from what is kept, elementwise work only: far cheaper than recomputing half the layers."""
    batch = 2048 * 4096
    lays = [Layout(tp=2, pp=8, dp=16, ep=32, virtual_stages=4, sharding="zero1", recompute=r)
            for r in ("none", "norm_act", "half")]
    ev = _eval(QWEN3, lays, batch)
    acts = ev.memory.activations
    assert acts[0] > acts[1] > acts[2]
    assert ev.memory.total_gib[0] - ev.memory.total_gib[1] > 10  # GiB on this layout
    steps = ev.step_time_s
    assert steps[0] < steps[1] < steps[0] * 1.02 and steps[1] < steps[2]
    result = search(QWEN3, H100, gpus=256, global_batch_tokens=batch, top=1,
                    fixed={"tp": 2, "pp": 8, "ep": 32, "virtual_stages": 4})
    dense = search(named_shape("llama3-8b", seq_len=4096), H100, gpus=8,
                   global_batch_tokens=64 * 4096, top=1, runnable_only=False)
    assert "norm_act" not in {RECOMPUTE[int(r)] for r in dense.candidates.recompute}
    assert RECOMPUTE.index("norm_act") in set(result.candidates.recompute.tolist())


def test_megatrons_1f1b_overlap_hides_part_of_what_pairs_and_nothing_under_gpipe():
    """Megatron's overlap pairs a micro-batch's forward with another's backward in the
    pipeline's steady state: the warm-up and cool-down stay exposed, and of what pairs
    EP_OVERLAP_1F1B is hidden. DualPipe hides all of it; GPipe pairs nothing."""
    from fm_pipeline.planner.step import EP_OVERLAP_1F1B, paired_share

    batch = 2048 * 4096
    base = {"tp": 2, "pp": 8, "dp": 16, "ep": 32, "sharding": "zero1", "recompute": "norm_act"}
    c = Candidates.from_layouts([Layout(**base, virtual_stages=4),
                                 Layout(**base, schedule="GPipe")])
    runs = {mode: evaluate(QWEN3, H100, c, global_batch_tokens=batch, ep_overlap=mode)
            for mode in ("none", "1f1b", "dualpipe")}
    none, f1b, dual = (runs[m].ep_comm_s for m in ("none", "1f1b", "dualpipe"))
    assert none[0] > f1b[0] > dual[0]
    assert f1b[1] == pytest.approx(none[1])  # GPipe: every forward before any backward
    # 128 micro-batches x 4 chunks on the first stage, 2 x 7 + 3 x 8 of them warm-up.
    share = paired_share(c, runs["none"].microbatches)
    assert share[0] == pytest.approx(1 - 38 / 512) and share[1] == 0
    # At most the partner's compute hides (here the all-to-all outlasts it).
    hideable = min(none[0], runs["none"].compute_s[0])
    assert none[0] - f1b[0] == pytest.approx(EP_OVERLAP_1F1B * share[0] * hideable, rel=1e-6)
    assert dual[0] == pytest.approx(none[0] - hideable, rel=1e-6)
    with pytest.raises(PlanInputError, match="ep_overlap"):
        evaluate(QWEN3, H100, c, global_batch_tokens=batch, ep_overlap="always")


def test_the_cli_states_a_folded_layout_and_the_all_to_all_overlap():
    import json

    from typer.testing import CliRunner

    from fm_pipeline.cli.plan import app

    common = ["--model", "qwen3-235b-a22b", "--gpus", "256", "--gpu-type", "h100",
              "--seq-len", "4096", "--global-batch-tokens", str(2048 * 4096), "--json",
              "--layout", "tp=2 pp=8 dp=16 ep=32 mb=1 v=4 recompute=norm_act zero1"]
    steps = {}
    for mode in ("none", "1f1b", "dualpipe"):
        out = CliRunner().invoke(app, ["estimate", *common, "--ep-overlap", mode])
        assert out.exit_code == 0, out.output
        steps[mode] = json.loads(out.output)["step_time_s"]
    assert steps["none"] > steps["1f1b"] > steps["dualpipe"]
    out = CliRunner().invoke(app, ["estimate", *common, "--ep-overlap", "always"])
    assert out.exit_code != 0 and "--ep-overlap: must be one of none, 1f1b, dualpipe" in out.output
    out = CliRunner().invoke(app, ["search", *common[:-2], "--tp", "2", "--pp", "8",
                                   "--any-layout", "--top", "1"])
    assert out.exit_code == 0, out.output
    (plan,) = json.loads(out.output)["plans"]
    assert any("folded over tp 2" in why for why in plan["reasons"]), plan["reasons"]
