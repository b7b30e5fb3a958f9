"""The Mixture-of-Experts feed-forward: routing as a per-token reference computes it, exact
parameter counts (Mixtral's published 46.7B / 12.9B), the balancing loss, capacity drops,
and a tiny MoE model that learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fm_pipeline.config import JobSpecError, parse_job
from fm_pipeline.defaults import DEMO_JOB
from fm_pipeline.model import Transformer, count_params, flops_per_token, get_model_config
from fm_pipeline.model.moe import MoEFeedForward


def _moe(**overrides) -> MoEFeedForward:
    torch.manual_seed(0)
    ffn = MoEFeedForward(get_model_config("moe-debug", **overrides))
    for p in ffn.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return ffn


def reference(ffn: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax, top-k, renormalised weights, each chosen expert's SwiGLU."""
    cfg, out = ffn.cfg, []
    for t in x.reshape(-1, x.shape[-1]):
        probs = F.softmax(ffn.router(t).float(), -1)
        top = probs.topk(cfg.moe_top_k)
        y = torch.zeros_like(t)
        for w, e in zip(top.values / top.values.sum(), top.indices.tolist(), strict=True):
            y += w * (F.silu(ffn.experts.w1[e] @ t) * (ffn.experts.w3[e] @ t)) @ ffn.experts.w2[e].T
        out.append(y + (ffn.shared(t) if ffn.shared is not None else 0))
    return torch.stack(out).reshape(x.shape)


@pytest.mark.parametrize("shared", [0, 1])
def test_the_dispatched_forward_equals_the_per_token_reference(shared):
    ffn = _moe(moe_shared_experts=shared)
    x = torch.randn(2, 7, 64)
    torch.testing.assert_close(ffn(x), reference(ffn, x), rtol=1e-5, atol=1e-5)
    assert sum(ffn.stats["tokens_per_expert"]) == 2 * 7 * 2 and ffn.stats["dropped_tokens"] == 0


def test_counts_are_exact_and_flops_use_the_active_experts_only():
    mixtral = count_params(get_model_config("mixtral-8x7b"))
    assert round(mixtral.total / 1e9, 1) == 46.7 and round(mixtral.active / 1e9, 1) == 12.9
    cfg = get_model_config("moe-tiny")
    with torch.device("meta"):
        model = Transformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg).total
    dense = get_model_config("moe-tiny", n_experts=0)
    # 2 of 8 routed experts (192 wide) + a shared one: 3 x 192 = 576 > the dense 384.
    assert flops_per_token(cfg, 128) > flops_per_token(dense, 128)
    assert count_params(cfg).active < count_params(cfg).total


def test_heads_wider_than_dim_over_heads_are_built_and_counted():
    """Qwen3's attention: query heads of attn_head_dim, not dim / n_heads (here 4 heads of
    32 over a 64-wide model: queries 128 wide)."""
    cfg = get_model_config("moe-debug", attn_head_dim=32)
    model = Transformer(cfg)
    model.init_weights(seed=0)
    assert model.layers["0"].attention.wq.weight.shape == (4 * 32, 64)
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg).total
    assert count_params(cfg).total > count_params(get_model_config("moe-debug")).total
    logits = model(torch.randint(0, cfg.vocab_size, (2, 16)))
    assert logits.shape == (2, 16, cfg.vocab_size) and torch.isfinite(logits).all()


def test_the_balancing_loss_is_its_coefficient_when_routing_is_uniform():
    ffn = _moe()
    torch.nn.init.zeros_(ffn.router.weight)  # every expert equally likely
    ffn(torch.randn(4, 16, 64))
    assert ffn.aux_loss.item() == pytest.approx(ffn.cfg.moe_aux_loss_coef, rel=1e-5)
    skewed = _moe()
    with torch.no_grad():
        skewed.router.weight[0] += 5.0 * torch.ones(64)
    skewed(torch.ones(4, 16, 64))  # everything prefers expert 0
    assert skewed.aux_loss.item() > 2 * skewed.cfg.moe_aux_loss_coef


def test_capacity_drops_the_overflow_and_counts_it():
    ffn = _moe(moe_capacity_factor=1.0)
    with torch.no_grad():
        ffn.router.weight.zero_()
        ffn.router.weight[0] += 1.0
        ffn.router.weight[1] += 0.5
    x = torch.ones(1, 32, 64)  # all 32 tokens pick experts 0 and 1: 64 slots, capacity 8
    out = ffn(x)
    assert ffn.stats["dropped_tokens"] == 64 - 2 * 8
    assert torch.count_nonzero(out.abs().sum(-1)) == 8  # only the first 8 tokens got output


def test_a_tiny_moe_model_learns_and_its_aux_loss_has_gradients():
    torch.manual_seed(0)
    cfg = get_model_config("moe-debug")
    model = Transformer(cfg)
    model.init_weights(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 64, (8, 33))  # a small vocabulary: learnable in a few steps
    losses = []
    for _ in range(30):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        (loss + model.moe_aux_loss()).backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    router = model.layers["0"].feed_forward.router.weight
    assert router.grad is not None and router.grad.abs().sum() > 0


def test_a_spec_asks_for_moe_only_where_it_trains():
    import yaml

    spec = yaml.safe_load(DEMO_JOB.read_text())
    spec["model"] = {"size": "moe-tiny", "vocab_size": 2048}
    assert parse_job(spec).model_cfg.n_experts == 8
    spec["parallelism"] = {"nproc_per_node": 4, "tp": 2, "dp_shard": 2}
    with pytest.raises(JobSpecError) as e:
        parse_job(spec)
    assert "parallelism.tp" in dict(e.value.problems)
    with pytest.raises(ValueError, match="moe_top_k"):
        get_model_config("moe-debug", moe_top_k=9)


def test_the_loss_free_bias_balances_a_skewed_router_without_gradients():
    """DeepSeek-V3's update: overloaded experts' biases fall, underloaded ones rise, until
    the top-k choice spreads; the weights still come from the unbiased scores."""
    ffn = _moe(moe_bias_update_rate=0.01)
    with torch.no_grad():
        ffn.router.weight[:2] += 0.2  # experts 0 and 1 win most tokens
    x = torch.randn(4, 16, 64) + 0.2

    def max_load() -> float:
        load = torch.tensor(ffn.stats["tokens_per_expert"], dtype=torch.float)
        return (load.max() / load.mean()).item()

    ffn(x)
    before = max_load()
    for _ in range(60):
        ffn(x)
        ffn.update_bias(ffn.stats["tokens_per_expert"])
    ffn(x)
    assert before > 2.5 and max_load() < 1.6, (before, max_load())
    assert ffn.expert_bias[:2].max() < 0 < ffn.expert_bias[2:].max()
    # The bias chose the experts; the output weighs them by the router's own scores.
    torch.testing.assert_close(ffn(x), reference_with_bias(ffn, x), rtol=1e-5, atol=1e-5)
    # Off by default, out of the state dict and of the model's hash.
    assert _moe().expert_bias is None and "expert_bias" not in _moe().state_dict()
    cfg = get_model_config("moe-debug")
    assert cfg.config_hash() == get_model_config("moe-debug", moe_bias_update_rate=0.0).config_hash()
    assert cfg.config_hash() != get_model_config("moe-debug", moe_bias_update_rate=1e-3).config_hash()


def reference_with_bias(ffn: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    cfg, out = ffn.cfg, []
    for t in x.reshape(-1, x.shape[-1]):
        probs = F.softmax(ffn.router(t).float(), -1)
        chosen = (probs + ffn.expert_bias).topk(cfg.moe_top_k).indices
        weights = probs[chosen] / probs[chosen].sum()
        y = torch.zeros_like(t)
        for w, e in zip(weights, chosen.tolist(), strict=True):
            ex = ffn.experts
            y += w * (F.silu(ex.w1[e] @ t) * (ex.w3[e] @ t)) @ ex.w2[e].T
        out.append(y)
    return torch.stack(out).reshape(x.shape)
