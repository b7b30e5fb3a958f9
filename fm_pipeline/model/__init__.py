"""Llama-style decoder and its size registry. Never imports torch.distributed."""

from fm_pipeline.model.config import ModelConfig
from fm_pipeline.model.flops import count_params, flops_per_token
from fm_pipeline.model.registry import get_model_config, model_names
from fm_pipeline.model.transformer import Transformer

__all__ = [
    "ModelConfig", "Transformer", "count_params", "flops_per_token", "get_model_config",
    "model_names",
]
