"""Exact parameter counts and training FLOPs per token for the Llama-style decoder.

FLOPs follow the PaLM convention (Chowdhery et al. 2022, appendix B), as torchtitan does:
6 x (parameters that take part in matmuls) + 12 x layers x heads x head_dim x seq_len.
The input embedding is a lookup, not a matmul, so it is excluded; the output head counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from fm_pipeline.model.config import ModelConfig


@dataclass(frozen=True)
class ParamCount:
    embedding: int
    per_layer: int  # a dense layer
    layers: int
    final_norm: int
    output: int
    active_layers: int = 0  # what one token's forward uses (MoE: the top-k experts); 0: layers

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.final_norm + self.output

    @property
    def active(self) -> int:
        """Parameters one token's forward uses: all of them in a dense model; in an MoE one
        the router, the top-k routed experts and the shared ones of each MoE layer."""
        return self.total - self.layers + (self.active_layers or self.layers)

    @property
    def non_embedding(self) -> int:
        """Parameters that take part in matmuls or norms (everything but the input lookup)."""
        return self.total - self.embedding


def count_params(cfg: ModelConfig) -> ParamCount:
    """Parameter count of exactly the modules `fm_pipeline.model.Transformer` builds."""
    d, hd = cfg.dim, cfg.head_dim
    attn = d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + cfg.n_heads * hd * d
    mlp = 3 * d * cfg.ffn_dim
    norms = 2 * d
    per_layer = attn + mlp + norms
    expert = 3 * d * cfg.expert_ffn_dim
    moe_base = attn + norms + d * cfg.n_experts + cfg.moe_shared_experts * expert  # + router
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    dense_layers = cfg.n_layers - moe_layers
    embedding = cfg.vocab_size * d
    output = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return ParamCount(
        embedding=embedding,
        per_layer=per_layer,
        layers=dense_layers * per_layer + moe_layers * (moe_base + cfg.n_experts * expert),
        final_norm=d,
        output=output,
        active_layers=dense_layers * per_layer + moe_layers * (moe_base + cfg.moe_top_k * expert),
    )


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """QK^T and AV for one token over a full window, forward + backward (x3), PaLM style."""
    return 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Model FLOPs of one training token (forward + backward), the numerator of MFU."""
    params = count_params(cfg)
    matmul_params = params.active - params.embedding  # MoE: the experts a token is routed to
    if cfg.tie_embeddings:
        # The tied matrix still does the output projection's matmul.
        matmul_params += params.embedding
    return 6 * matmul_params + attention_flops_per_token(cfg, seq_len)
