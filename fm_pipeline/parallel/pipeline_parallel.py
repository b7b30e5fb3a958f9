"""Pipeline parallelism with torch.distributed.pipelining: stage split and schedules.

The decoder is cut into pp x pp_virtual_stages stages of equal layer counts, or of the counts
parallelism.pp_layers_per_stage gives (first and last lighter, as Llama 3 ran); the first
stage also holds the embedding, the last the final norm and output head. With
Interleaved1F1B a pp rank holds stages rank, rank + pp, rank + 2pp, ... ("loop" placement);
with 1F1B and GPipe one stage each. A stage is the model with the other layers' keys
deleted, so its parameter names are those of the whole model. The schedule itself is in
pipeline_schedule.py, imported only when pp > 1: torch.distributed.pipelining (with the
torch._dynamo it loads) adds ~1.7 s to every worker's start on 2 cores.
"""

from __future__ import annotations

from fm_pipeline.model import ModelConfig, Transformer


def stage_ids(*, pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    return [pp_rank + v * pp for v in range(virtual_stages)]


def stage_layers(cfg: ModelConfig, *, stage: int, n_stages: int,
                 split: list[int] | None = None) -> range:
    """The layers of `stage`: `split[stage]` of them after the earlier stages' (an uneven
    split, parallelism.pp_layers_per_stage), else an equal share."""
    if split is not None:
        if len(split) != n_stages or sum(split) != cfg.n_layers or min(split) < 1:
            raise ValueError(f"pp_layers_per_stage {split} must give each of the {n_stages} "
                             f"stages at least one of the {cfg.n_layers} layers")
        start = sum(split[:stage])
        return range(start, start + split[stage])
    if cfg.n_layers % n_stages:
        raise ValueError(f"n_layers ({cfg.n_layers}) must be divisible by the {n_stages} stages")
    per_stage = cfg.n_layers // n_stages
    return range(stage * per_stage, (stage + 1) * per_stage)


def build_stage_module(cfg: ModelConfig, *, stage: int, n_stages: int,
                       split: list[int] | None = None) -> Transformer:
    """The decoder restricted to one stage (built on the current default device). Its
    layers keep their global names, so a checkpoint reshards between any two splits."""
    model = Transformer(cfg)
    keep = {str(i) for i in stage_layers(cfg, stage=stage, n_stages=n_stages, split=split)}
    for key in [k for k in model.layers if k not in keep]:
        del model.layers[key]
    if stage > 0:
        model.tok_embeddings = None
    if stage < n_stages - 1:
        model.norm = None
        model.output = None
    return model
