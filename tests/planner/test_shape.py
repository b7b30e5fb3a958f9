"""Parameter counts and FLOPs per token against the closed forms in the literature."""

from __future__ import annotations

import pytest

from fm_pipeline.model import count_params, flops_per_token, get_model_config, model_names
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.shape import GPT_SIZES, ModelShape, default_ffn, named_shape


def narayanan_params(layers, h, V, s):
    """Narayanan et al. 2021, eq. (2)."""
    return 12 * layers * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * layers * h))


def test_gpt3_175b_parameters_match_the_closed_form():
    shape = named_shape("gpt3-175b")
    p = shape.params()
    # eq. (2) leaves out the final LayerNorm; everything else matches to the parameter.
    assert p.total - p.final_norm == pytest.approx(
        narayanan_params(96, 12288, 50257, 2048), rel=1e-12
    )
    assert 174.5e9 < p.total < 174.7e9  # "175B"


def test_gpt3_flops_per_token_match_narayanan_eq_7():
    shape = named_shape("gpt3-175b")
    layers, h, V, s = 96, 12288, 50257, 2048
    # Per token, without recomputation:
    closed = 72 * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h))
    assert shape.model_flops_per_token() == pytest.approx(closed, rel=2e-4)
    assert shape.model_flops_per_token() == pytest.approx(6 * shape.params().total, rel=0.05)


@pytest.mark.parametrize(
    "name", [n for n in GPT_SIZES if n.startswith("megatron-") and n != "megatron-22b"]
)
def test_megatron_table_1_sizes_give_the_published_parameter_counts(name):
    published = {
        "1.7b": 1.7,
        "3.6b": 3.6,
        "7.5b": 7.5,
        "18.4b": 18.4,
        "39.1b": 39.1,
        "76.1b": 76.1,
        "145.6b": 145.6,
        "175b": 174.6,
        "310.1b": 310.1,
        "529.6b": 529.6,
        "1t": 1008.0,
    }[name.removeprefix("megatron-")]
    assert named_shape(name).params().total / 1e9 == pytest.approx(published, abs=0.06)


DENSE = [n for n in model_names() if not get_model_config(n).n_experts]
MOE = [n for n in model_names() if n not in DENSE]


@pytest.mark.parametrize("name", model_names())
def test_llama_shapes_count_exactly_what_the_trainer_builds(name):
    """Dense and MoE sizes: total, active and FLOPs per token (active experts only) are the
    trainer's own numbers, so planned and measured MFU share one numerator."""
    cfg = get_model_config(name)
    shape = named_shape(name, seq_len=cfg.max_seq_len)
    assert shape.params().total == count_params(cfg).total
    assert shape.params().active == count_params(cfg).active
    assert shape.model_flops_per_token() == flops_per_token(cfg, cfg.max_seq_len)


def test_moe_sizes_are_planned_with_their_published_counts():
    assert MOE
    mixtral = named_shape("mixtral-8x7b").params()
    assert mixtral.total / 1e9 == pytest.approx(46.7, abs=0.05)  # Mistral AI: 46.7B
    assert mixtral.active / 1e9 == pytest.approx(12.9, abs=0.05)  # 12.9B active
    big = named_shape("mixtral-8x22b").params()
    assert (round(big.total / 1e9), round(big.active / 1e9)) == (141, 39)  # Mistral AI
    ds = named_shape("deepseek-v3-like")
    # DeepSeek-V3: 671B / 37B; GQA stands in for MLA (docs/planner.md), within 1% / 5%.
    assert ds.params().total == pytest.approx(671e9, rel=0.01)
    assert ds.params().active == pytest.approx(37e9, rel=0.05)
    assert (ds.moe_layers, ds.dense_layers, ds.experts, ds.top_k) == (58, 3, 256, 8)
    # FLOPs count only the routed experts a token uses: ~6 x active, not 6 x total.
    assert ds.model_flops_per_token() < 7 * ds.params().active
    # Qwen3 (Qwen's configs): 64 query heads of 128 over a 4096-wide model, all layers MoE.
    qwen = named_shape("qwen3-235b-a22b", seq_len=4096)
    assert qwen.params().total / 1e9 == pytest.approx(235.1, abs=0.05)  # Qwen: 235B
    assert qwen.params().active / 1e9 == pytest.approx(22.2, abs=0.05)  # 22B active
    assert (qwen.q_dim, qwen.kv_dim, qwen.moe_layers) == (8192, 512, 94)
    small = named_shape("qwen3-30b-a3b").params()
    assert (round(small.total / 1e9, 1), round(small.active / 1e9, 1)) == (30.5, 3.4)


def test_moe_shape_refuses_inconsistent_fields_by_name():
    base = dict(layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=64)
    with pytest.raises(PlanInputError) as e:
        ModelShape(**base, experts=4, top_k=8, expert_ffn=32, moe_layers=4)
    assert e.value.field == "top_k"
    with pytest.raises(PlanInputError) as e:
        ModelShape(**base, experts=4, top_k=2, expert_ffn=32, moe_layers=4,
                   expert_imbalance=0.5)
    assert e.value.field == "expert_imbalance"


def test_llama3_405b_budget_matches_the_papers_training_flops():
    # Llama 3 paper: 405B parameters, 15.6T tokens, 3.8e25 FLOPs (6 N D).
    shape = named_shape("llama3-405b", seq_len=8192)
    assert 6 * shape.params().total * 15.6e12 == pytest.approx(3.8e25, rel=0.01)
    # Attention over 8K tokens adds 12 L h s per token, about 8% on top of 6 N.
    assert 1.07 < shape.model_flops_per_token() / (6 * shape.params().total) < 1.09


def test_default_ffn_follows_llama_and_gpt_rules():
    assert default_ffn(4096, "swiglu") == 11008  # Llama 2 7B
    assert default_ffn(12288, "gelu") == 4 * 12288


def test_bad_shapes_name_the_field():
    with pytest.raises(PlanInputError, match="kv_heads") as e:
        ModelShape(layers=2, hidden=64, heads=8, kv_heads=3, ffn=128, vocab=100, seq_len=16)
    assert e.value.flag == "--kv-heads"
    with pytest.raises(PlanInputError, match="heads"):
        ModelShape(layers=2, hidden=100, heads=8, kv_heads=8, ffn=128, vocab=100, seq_len=16)
    with pytest.raises(PlanInputError, match="model: unknown model 'gpt-9'"):
        named_shape("gpt-9")
