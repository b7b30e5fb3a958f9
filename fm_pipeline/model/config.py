"""Shape of a Llama-style decoder: the one description the model, the planner and the
checkpoint manifest share."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Mixture-of-Experts fields; a dense model leaves them at their defaults and its hash is
# what it was before they existed (checkpoints stay resumable).
MOE_FIELDS = ("n_experts", "moe_top_k", "moe_ffn_dim", "moe_shared_experts", "moe_every",
              "moe_first_dense", "moe_capacity_factor", "moe_aux_loss_coef",
              "moe_bias_update_rate")
# Fields added after MoE checkpoints existed: left at these defaults they stay out of the
# hash too.
LATER_DEFAULTS = {"moe_bias_update_rate": 0.0}


class ModelConfig(BaseModel):
    """Architecture hyper-parameters. `ffn_dim` is the SwiGLU hidden width (three matrices)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    n_layers: int = Field(gt=0)
    dim: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    attn_head_dim: int = Field(
        default=0, ge=0, description="width of one attention head; 0: dim / n_heads. Qwen3 "
        "sets it apart: 64 heads of 128 in a 4096-wide model (queries 8192 wide)")
    ffn_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    norm_eps: float = Field(default=1e-5, gt=0)
    tie_embeddings: bool = False
    # Mixture of Experts (fm_pipeline/model/moe.py): 0 experts is a dense model.
    n_experts: int = Field(default=0, ge=0, description="routed experts per MoE layer")
    moe_top_k: int = Field(default=2, gt=0, description="experts each token is routed to")
    moe_ffn_dim: int | None = Field(default=None, gt=0, description="expert width; ffn_dim")
    moe_shared_experts: int = Field(default=0, ge=0, description="always-on experts")
    moe_every: int = Field(default=1, gt=0, description="every k-th layer (after the dense "
                                                        "ones) is an MoE layer")
    moe_first_dense: int = Field(default=0, ge=0, description="leading dense layers")
    moe_capacity_factor: float = Field(default=0.0, ge=0, description="0: no token dropped")
    moe_aux_loss_coef: float = Field(default=0.01, ge=0)
    moe_bias_update_rate: float = Field(
        default=0.0, ge=0, description="DeepSeek-V3's auxiliary-loss-free balancing: each "
        "step, every expert's routing bias moves by this much towards the mean load; 0: off")

    @model_validator(mode="after")
    def _check_shape(self) -> "ModelConfig":
        if self.n_experts and self.moe_top_k > self.n_experts:
            raise ValueError(f"moe_top_k ({self.moe_top_k}) exceeds n_experts ({self.n_experts})")
        if self.n_experts and not any(self.is_moe_layer(i) for i in range(self.n_layers)):
            raise ValueError(f"moe_first_dense ({self.moe_first_dense}) leaves no MoE layer "
                             f"among the {self.n_layers}")
        if not self.attn_head_dim and self.dim % self.n_heads:
            raise ValueError(
                f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})"
                " for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        return self

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.dim // self.n_heads

    @property
    def expert_ffn_dim(self) -> int:
        return self.moe_ffn_dim or self.ffn_dim

    def is_moe_layer(self, layer: int) -> bool:
        return (self.n_experts > 0 and layer >= self.moe_first_dense
                and (layer - self.moe_first_dense) % self.moe_every == 0)

    def config_hash(self) -> str:
        """Stable short hash: two checkpoints with the same hash hold the same architecture."""
        fields = self.model_dump(exclude=set(MOE_FIELDS) if not self.n_experts else None)
        for name, default in LATER_DEFAULTS.items():
            if fields.get(name) == default:
                del fields[name]
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
