"""Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU, grouped-query attention;
any layer's SwiGLU may be a Mixture of Experts (model/moe.py, chosen by the config).

    from fm_pipeline.model import Transformer, get_model_config
    model = Transformer(get_model_config("debug"))
    model.init_weights(seed=1234)
    logits = model(tokens)                 # [batch, seq] -> [batch, seq, vocab]

Parallelism is applied from outside (`fm_pipeline.parallel`), so this file never imports
torch.distributed. Layers live in a ModuleDict keyed "0".."n-1": a pipeline stage deletes
the keys it does not own (and sets `tok_embeddings`/`norm`/`output` to None) and the
parameter names stay those of the whole model, so checkpoints reshard across stages.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fm_pipeline.model.config import ModelConfig
from fm_pipeline.model.init import WriteFn, copy_full, init_parameters
from fm_pipeline.model.moe import MoEFeedForward


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even when activations are bf16, as Llama does.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_cache(cfg: ModelConfig) -> torch.Tensor:
    """[max_seq_len, head_dim // 2, 2] holding (cos, sin) of each position x frequency."""
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def apply_rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of x [batch, seq, heads, head_dim] (Meta's Llama layout)."""
    seq = x.shape[1]
    cos = cache[:seq, :, 0].view(1, seq, 1, -1)
    sin = cache[:seq, :, 1].view(1, seq, 1, -1)
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_heads / tp of them.
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=True, enable_gqa=q.shape[2] != k.shape[2],
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = MoEFeedForward(cfg) if cfg.is_moe_layer(layer_id) else FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it once keys are dropped."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.dim, cfg.norm_eps)
        # Tied embeddings reuse tok_embeddings.weight in forward (no second parameter).
        self.output: nn.Linear | None = (
            None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        )
        # Not persistent: derived from the config, so never part of a checkpoint.
        self.register_buffer("rope", rope_cache(cfg), persistent=False)

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        h = tokens_or_hidden
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        if self.norm is None:  # an inner pipeline stage hands hidden states on
            return h
        h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        return F.linear(h, self.tok_embeddings.weight)

    def moe_layers(self) -> list[MoEFeedForward]:
        """This part's MoE feed-forwards (empty for a dense model)."""
        return [layer.feed_forward for layer in self.layers.values()
                if isinstance(layer.feed_forward, MoEFeedForward)]

    def moe_layer_ids(self) -> list[int]:
        """The place in the whole model of each of moe_layers() (a pipeline stage holds
        some of them)."""
        return [int(key) for key, layer in self.layers.items()
                if isinstance(layer.feed_forward, MoEFeedForward)]

    def take_router_stats(self) -> tuple[list[list[int]], int] | None:
        """Token-slots per expert of each of this part's MoE layers, and the dropped slots of
        all, summed over the forwards since the last call (which resets them); None for a
        dense model."""
        layers = self.moe_layers()
        if not layers:
            return None
        loads = [list(m.load_total) for m in layers]
        dropped = sum(m.dropped_total for m in layers)
        for m in layers:
            m.load_total, m.dropped_total = [0] * len(m.load_total), 0
        return loads, dropped

    def update_router_bias(self, loads: list[list[float]]) -> None:
        """Auxiliary-loss-free balancing: each MoE layer's bias from its load of the step
        (as take_router_stats returned it, summed over ranks); no-op where it is off."""
        for m, load in zip(self.moe_layers(), loads, strict=True):
            m.update_bias(load)

    def detach_moe_aux_loss(self) -> None:
        """After the backward: each MoE layer keeps its aux loss as a value for the metrics,
        not the graph behind it (the graph's nodes would keep the layer's FSDP state, and
        with it the process groups, alive after the model is dropped)."""
        for m in self.moe_layers():
            if m.aux_loss is not None:
                m.aux_loss = m.aux_loss.detach()

    def moe_aux_loss(self) -> torch.Tensor | None:
        """The load-balancing loss of the last forward, weighted by moe_aux_loss_coef: what
        training adds to the next-token loss; None for a dense model."""
        losses = [m.aux_loss for m in self.moe_layers() if m.aux_loss is not None]
        return torch.stack(losses).sum() if losses else None

    @torch.no_grad()
    def init_weights(self, *, seed: int, write: WriteFn = copy_full) -> None:
        """Deterministic initialisation: parameter `name` gets the same values whatever the
        parallelism (each is drawn whole from a generator seeded by seed and name).

        Works on a model materialised with `to_empty` after parallelisation (meta-device
        build) and on a plain one; `write(param, full)` stores the part of `full` this rank
        holds (`fm_pipeline.parallel` passes one that understands sharded parameters).
        The rotary cache is recomputed too (after `to_empty` it holds garbage).
        """
        self.rope.copy_(rope_cache(self.cfg).to(self.rope.device))
        for m in self.moe_layers():  # (after to_empty the bias holds garbage too)
            if m.expert_bias is not None:
                m.expert_bias.zero_()
        init_parameters(self, seed=seed, std_for=self._init_std, write=write)

    def _init_std(self, name: str) -> float | None:
        """Standard deviation for a parameter name; None means ones (norm weights)."""
        if name.endswith("norm.weight"):
            return None
        if name.startswith("tok_embeddings"):
            # Tied, the same matrix produces the logits: keep them O(1) at the start.
            return self.cfg.dim ** -0.5 if self.cfg.tie_embeddings else 1.0
        if name.startswith("output"):
            return self.cfg.dim ** -0.5
        if name.endswith(("wo.weight", "w2.weight", "experts.w2")):  # (experts: stacked)
            # Residual projections shrink with depth (as in torchtitan's Llama init).
            layer = int(name.split(".")[1])
            return 0.02 / math.sqrt(2 * (layer + 1))
        return 0.02
