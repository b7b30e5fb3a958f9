"""Llama-style decoder and its size registry. Never imports torch.distributed.

Shapes, the registry and FLOP counts are plain Python; `Transformer` (and torch with it)
loads on first use, so `import fm_pipeline.config` and the CLI stay fast.
"""

from fm_pipeline.model.config import ModelConfig
from fm_pipeline.model.flops import count_params, flops_per_token
from fm_pipeline.model.registry import get_model_config, model_names

__all__ = [
    "ModelConfig", "Transformer", "count_params", "flops_per_token", "get_model_config",
    "model_names",
]


def __getattr__(name: str):
    if name == "Transformer":
        from fm_pipeline.model.transformer import Transformer

        return Transformer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
