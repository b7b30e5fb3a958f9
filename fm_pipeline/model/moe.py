"""Mixture-of-Experts feed-forward: a router picks the top-k of `n_experts` SwiGLU experts
per token, optionally beside always-on shared experts (DeepSeek-style).

    ffn = MoEFeedForward(cfg)              # cfg.n_experts > 0
    out = ffn(x)                            # [batch, seq, dim] -> the same
    ffn.aux_loss, ffn.stats                # of the last forward

Routing: softmax over the router's logits in fp32, top-k, the k weights renormalised to
sum to one (Mixtral, Qwen3). Load balancing: Switch Transformer's auxiliary loss,
E x sum_i f_i P_i (f_i: share of the token-slots routed to expert i, P_i: its mean router
probability), 1 when uniform, scaled by `moe_aux_loss_coef` and added to the training
loss. (DeepSeek-V3's auxiliary-loss-free bias update is not built yet: it needs the load
summed over data-parallel ranks after each step.)

Capacity (`moe_capacity_factor` > 0): each expert takes at most ceil(factor x tokens x k /
E) token-slots, the later tokens beyond it are dropped (their slot contributes nothing;
the residual carries them), and counted.

Experts are stored stacked ([E, ffn, dim] and [E, dim, ffn]), so expert parallelism can
shard them along the first dimension; this file never imports torch.distributed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fm_pipeline.model.config import ModelConfig


class MoEFeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        e, d, f = cfg.n_experts, cfg.dim, cfg.expert_ffn_dim
        self.router = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, f, d))
        self.w3 = nn.Parameter(torch.empty(e, f, d))
        self.w2 = nn.Parameter(torch.empty(e, d, f))
        self.shared = SharedExperts(d, f * cfg.moe_shared_experts) \
            if cfg.moe_shared_experts else None
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict | None = None  # of the last forward
        # Summed over forwards until taken (the trainer reads them once per step); plain
        # ints, never tensors: the module may be built on the meta device.
        self.load_total = [0] * e
        self.dropped_total = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        expert_idx = probs.topk(cfg.moe_top_k, dim=-1).indices  # [T, k]
        weights = probs.gather(-1, expert_idx)
        weights = weights / weights.sum(-1, keepdim=True)
        load = torch.bincount(expert_idx.reshape(-1), minlength=cfg.n_experts)
        routed = load.to(probs.dtype) / load.sum()  # f_i: not differentiable, P_i is
        self.aux_loss = cfg.moe_aux_loss_coef * cfg.n_experts * (routed * probs.mean(0)).sum()
        out, dropped = self._experts(tokens, expert_idx, weights.to(tokens.dtype))
        self.stats = {"tokens_per_expert": load.tolist(), "dropped_tokens": dropped}
        self.load_total = [a + b for a, b in zip(self.load_total, self.stats["tokens_per_expert"],
                                                 strict=True)]
        self.dropped_total += dropped
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.reshape(shape)

    def _experts(self, tokens: torch.Tensor, expert_idx: torch.Tensor,
                 weights: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Each expert's SwiGLU over the token-slots routed to it (within capacity), summed
        back per token with the routing weights; and how many slots were dropped."""
        cfg = self.cfg
        n_tokens, k, n_experts = tokens.shape[0], cfg.moe_top_k, cfg.n_experts
        flat_expert = expert_idx.reshape(-1)  # token-slot s = token s // k, choice s % k
        keep = torch.ones_like(flat_expert, dtype=torch.bool)
        if cfg.moe_capacity_factor > 0:
            capacity = math.ceil(cfg.moe_capacity_factor * n_tokens * k / n_experts)
            # Position of each slot within its expert's queue, in token order.
            onehot = F.one_hot(flat_expert, n_experts)
            position = (onehot.cumsum(0) * onehot).sum(-1) - 1
            keep = position < capacity
        order = torch.argsort(flat_expert[keep], stable=True)
        slots = torch.nonzero(keep).squeeze(-1)[order]
        counts = torch.bincount(flat_expert[slots], minlength=n_experts).tolist()
        out = torch.zeros_like(tokens)
        start = 0
        for e, count in enumerate(counts):
            if count == 0:
                continue
            chosen = slots[start:start + count]
            start += count
            rows = chosen // k
            h = tokens[rows]
            y = F.linear(F.silu(F.linear(h, self.w1[e])) * F.linear(h, self.w3[e]), self.w2[e])
            y = y * weights.reshape(-1)[chosen].unsqueeze(-1)
            out.index_add_(0, rows, y.to(out.dtype))  # (autocast computes y in bf16)
        return out, int((~keep).sum())


class SharedExperts(nn.Module):
    """The always-on experts, one SwiGLU as wide as all of them together."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
