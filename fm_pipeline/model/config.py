"""Shape of a Llama-style decoder: the one description the model, the planner and the
checkpoint manifest share."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    """Architecture hyper-parameters. `ffn_dim` is the SwiGLU hidden width (three matrices)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    n_layers: int = Field(gt=0)
    dim: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    ffn_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    norm_eps: float = Field(default=1e-5, gt=0)
    tie_embeddings: bool = False

    @model_validator(mode="after")
    def _check_shape(self) -> "ModelConfig":
        if self.dim % self.n_heads:
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
        return self.dim // self.n_heads

    def config_hash(self) -> str:
        """Stable short hash: two checkpoints with the same hash hold the same architecture."""
        blob = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
