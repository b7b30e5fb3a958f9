"""Llama-style decoder and its size registry. Never imports torch.distributed.

`Transformer` (torch) is imported on first use, so the job spec, the planner and the API
can use shapes and FLOP counts without paying for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fm_pipeline.lazy import lazy_exports
from fm_pipeline.model.config import ModelConfig
from fm_pipeline.model.flops import count_params, flops_per_token
from fm_pipeline.model.registry import get_model_config, model_names

if TYPE_CHECKING:
    from fm_pipeline.model.transformer import Transformer


__getattr__ = lazy_exports(__name__, {"Transformer": "transformer"})


__all__ = [
    "ModelConfig", "Transformer", "count_params", "flops_per_token", "get_model_config",
    "model_names",
]
