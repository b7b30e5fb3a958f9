"""Mixture-of-Experts feed-forward: a router picks the top-k of `n_experts` SwiGLU experts
per token, optionally beside always-on shared experts (DeepSeek-style).

    ffn = MoEFeedForward(cfg)              # cfg.n_experts > 0
    out = ffn(x)                            # [batch, seq, dim] -> the same
    ffn.aux_loss, ffn.stats                # of the last forward

Routing: softmax over the router's logits in fp32, top-k, the k weights renormalised to
sum to one (Mixtral, Qwen3). Load balancing: Switch Transformer's auxiliary loss,
E x sum_i f_i P_i (f_i: share of the token-slots routed to expert i, P_i: its mean router
probability), 1 when uniform, scaled by `moe_aux_loss_coef` and added to the training
loss; and/or DeepSeek-V3's auxiliary-loss-free bias (`moe_bias_update_rate` > 0): a bias
per expert shifts which experts are chosen, never their weights, and moves after each step
by the rate towards balance, from the load summed over every data-parallel rank (the
trainer calls `update_bias` with it).

Capacity (`moe_capacity_factor` > 0): each expert takes at most ceil(factor x tokens x k /
E) token-slots, the later tokens beyond it are dropped (their slot contributes nothing;
the residual carries them), and counted.

Experts are stored stacked ([E, ffn, dim] and [E, dim, ffn]) in `GroupedExperts`, which
takes its token rows grouped by expert: expert parallelism (fm_pipeline/parallel/
expert_parallel.py) shards the stack along its first dimension and wraps that module with
the all-to-all dispatch and combine; this file never imports torch.distributed.
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
        self.experts = GroupedExperts(e, d, f)
        self.shared = SharedExperts(d, f * cfg.moe_shared_experts) \
            if cfg.moe_shared_experts else None
        # Auxiliary-loss-free balancing (DeepSeek-V3 2.1.2): a per-expert bias added to the
        # scores for choosing the top k only (the weights use the scores as they are),
        # moved after every step towards balance (`update_bias`); saved with the model.
        self.register_buffer("expert_bias",
                             torch.zeros(e) if cfg.moe_bias_update_rate > 0 else None)
        self.aux_loss: torch.Tensor | None = None
        # Under pipeline parallelism the schedule's loss sees only the last stage's output:
        # each layer then carries its aux loss in the backward of its own output instead
        # (Megatron-Core's MoEAuxLossAutoScaler), with the schedule scaling every gradient
        # by its micro-batches as it does the next-token loss's.
        self.aux_loss_in_backward = False
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
        choice = probs if self.expert_bias is None else probs + self.expert_bias
        expert_idx = choice.topk(cfg.moe_top_k, dim=-1).indices  # [T, k]
        weights = probs.gather(-1, expert_idx)
        weights = weights / weights.sum(-1, keepdim=True)
        load = torch.bincount(expert_idx.reshape(-1), minlength=cfg.n_experts)
        routed = load.to(probs.dtype) / load.sum()  # f_i: not differentiable, P_i is
        self.aux_loss = cfg.moe_aux_loss_coef * cfg.n_experts * (routed * probs.mean(0)).sum()
        slots, counts, dropped = self._expert_order(expert_idx)
        rows = slots // cfg.moe_top_k  # token-slot s = token s // k, choice s % k
        # The experts see their token-slots grouped by expert (what expert parallelism
        # dispatches); their outputs come back in the same order.
        y = self.experts(tokens[rows], counts)
        y = y * weights.to(tokens.dtype).reshape(-1)[slots].unsqueeze(-1)
        out = torch.zeros_like(tokens).index_add_(0, rows, y.to(tokens.dtype))
        self.stats = {"tokens_per_expert": load.tolist(), "dropped_tokens": dropped}
        self.load_total = [a + b for a, b in zip(self.load_total, self.stats["tokens_per_expert"],
                                                 strict=True)]
        self.dropped_total += dropped
        if self.shared is not None:
            out = out + self.shared(tokens)
        if self.aux_loss_in_backward and torch.is_grad_enabled():
            out = _AuxLossInBackward.apply(out, self.aux_loss)
        return out.reshape(shape)

    @torch.no_grad()
    def update_bias(self, load: list[float]) -> None:
        """One balancing step from this layer's token-slots per expert over the whole step
        (summed over every data-parallel rank, so every rank moves its bias the same way):
        each overloaded expert's bias falls by the update rate, each underloaded one's
        rises (DeepSeek-V3: b_i += gamma x sign(mean load - load_i))."""
        if self.expert_bias is None:
            return
        load_t = torch.tensor(load, dtype=self.expert_bias.dtype, device=self.expert_bias.device)
        self.expert_bias += self.cfg.moe_bias_update_rate * torch.sign(load_t.mean() - load_t)

    def _expert_order(self, expert_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The kept token-slots sorted by expert (stable: token order within an expert),
        the count per expert, and how many slots capacity dropped."""
        cfg = self.cfg
        n_tokens, k, n_experts = expert_idx.shape[0], cfg.moe_top_k, cfg.n_experts
        flat_expert = expert_idx.reshape(-1)
        keep = torch.ones_like(flat_expert, dtype=torch.bool)
        if cfg.moe_capacity_factor > 0:
            capacity = math.ceil(cfg.moe_capacity_factor * n_tokens * k / n_experts)
            # Position of each slot within its expert's queue, in token order.
            onehot = F.one_hot(flat_expert, n_experts)
            position = (onehot.cumsum(0) * onehot).sum(-1) - 1
            keep = position < capacity
        order = torch.argsort(flat_expert[keep], stable=True)
        slots = torch.nonzero(keep).squeeze(-1)[order]
        counts = torch.bincount(flat_expert[slots], minlength=n_experts)
        return slots, counts, int((~keep).sum())


class _AuxLossInBackward(torch.autograd.Function):
    """Identity on the layer's output; its backward also gives the aux loss the gradient
    it would get had it been added to the loss (one), so the router learns to balance in
    any pipeline stage."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        return grad_out, torch.ones_like(aux_loss)


class GroupedExperts(nn.Module):
    """The routed experts' SwiGLUs, stacked: w1, w3 [E, ffn, dim], w2 [E, dim, ffn].

    forward(x, counts): x holds token rows grouped by expert, counts[e] rows for expert e
    (for the experts this module holds: expert parallelism shards the stack along its
    first dimension and hands each rank the rows for its own experts)."""

    def __init__(self, n_experts: int, dim: int, ffn_dim: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, ffn_dim, dim))
        self.w3 = nn.Parameter(torch.empty(n_experts, ffn_dim, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, ffn_dim))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (_local(w) for w in (self.w1, self.w2, self.w3))
        out = []
        for e, rows in enumerate(x.split(counts.tolist())):
            if rows.shape[0]:
                out.append(F.linear(F.silu(F.linear(rows, w1[e])) * F.linear(rows, w3[e]), w2[e]))
        if not out:
            # No rows for any of these experts: zero gradients still reach every weight, so
            # the data-parallel reduction of this rank's experts matches its peers'.
            return x + 0 * (w1.sum() + w2.sum() + w3.sum())
        return torch.cat(out)


def expert_modules(module: nn.Module) -> list[GroupedExperts]:
    """Every GroupedExperts inside `module` (however wrapped)."""
    return [m for m in module.modules() if isinstance(m, GroupedExperts)]


def _local(w: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a parameter that expert parallelism made a DTensor (duck-typed:
    this file never imports torch.distributed)."""
    return w.to_local() if hasattr(w, "to_local") else w


class SharedExperts(nn.Module):
    """The always-on experts, one SwiGLU as wide as all of them together."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
