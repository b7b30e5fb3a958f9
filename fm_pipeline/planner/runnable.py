"""What the trainer can run: the search's space by default, and the reasons a layout the
cost model can express cannot be launched here.

    from fm_pipeline.planner.runnable import not_runnable, runnable_mask
    not_runnable(shape, Layout(tp=8, cp=2, dp=64, sharding="zero2"))
    # ['cp 2: context parallelism needs a GPU to verify: ...', 'zero2: ...']

The trainer (fm_pipeline.parallel) shards with FSDP2 over all data-parallel ranks or, hybrid
(HSDP), within groups replicated across the rest; with one rank per shard group it
replicates, which moves what DDP moves. It has tensor parallelism with sequence parallelism,
the 1F1B, Interleaved1F1B and GPipe schedules with layers split evenly over the pipeline
chunks or, where they do not divide, as `balanced_split` gives them (first and last
lighter), and activation checkpointing none|selective|full (its selective is op-level: the
planner's recompute "op"); ZeRO-1 as FSDP2 with the weights and gradients kept whole
through a step (parallelism.fsdp_keep_gathered). DeepSpeed's ZeRO-2, context parallelism,
Megatron's selective recomputation and recomputing half the layers exist in the cost model
only; tied embeddings cannot be split by tp or pp (the job spec refuses them,
fm_pipeline/config/spec.py). Mixture-of-Experts models train with FSDP2, expert
parallelism (ep within the shard group) and pipeline stages, without tp so far. FP8 trains
with torchao's tensorwise and rowwise recipes on dense models; DeepSeek-V3's blockwise
recipe is planned only.
"""

from __future__ import annotations

import numpy as np

from fm_pipeline.planner.layout import RECOMPUTE, SHARDING, Candidates, Layout
from fm_pipeline.planner.precision import get_precision
from fm_pipeline.planner.shape import ModelShape
from fm_pipeline.planner.step import ep_overlap_mode

# zero1 (weights and gradients whole through the step, optimizer state sharded, one
# all-gather and one reduce-scatter a step) is FSDP2 with parallelism.fsdp_keep_gathered.
RUNNABLE_SHARDING = ("ddp", "zero1", "fsdp")
# The trainer's activation_checkpoint none | selective | full: its selective is op-level
# (the planner's "op"), not Megatron's attention-core recomputation ("selective" here).
RUNNABLE_RECOMPUTE = ("none", "op", "full")
TRAINER_ACTIVATION_CHECKPOINT = {"none": "none", "op": "selective", "full": "full"}
PLANNER_RECOMPUTE = {v: k for k, v in TRAINER_ACTIVATION_CHECKPOINT.items()}


def model_not_runnable(shape: ModelShape) -> str | None:
    """Why the trainer cannot build this model at all (it builds Llama-style decoders)."""
    if (shape.mlp, shape.norm, shape.learned_positions, shape.bias) == (
            "swiglu", "rmsnorm", False, False):
        return None
    return (f"{shape.name} is GPT-style ({shape.mlp}, {shape.norm}"
            f"{', learned positions' if shape.learned_positions else ''}"
            f"{', biases' if shape.bias else ''}); the trainer builds Llama-style decoders "
            "(SwiGLU, RMSNorm, RoPE), so only the cost model plans it")


TRAINER_FP8 = ("fp8-tensorwise", "fp8-rowwise")


def precision_not_runnable(shape: ModelShape, precision: str) -> str | None:
    """Why the trainer cannot train `shape` in `precision` (any layout), else None."""
    precision = get_precision(precision).name
    if not precision.startswith("fp8"):
        return None
    if precision not in TRAINER_FP8:
        return (f"{precision}: the trainer's FP8 (torchao Float8Linear) has the "
                f"{' and '.join(r.removeprefix('fp8-') for r in TRAINER_FP8)} recipes")
    if shape.experts:
        return f"{precision} with Mixture of Experts: the trainer's experts stay bf16"
    return None


def ep_overlap_not_runnable(ep_overlap) -> str | None:
    """Why a plan costed with the all-to-all overlapped is not what the trainer runs."""
    mode = ep_overlap_mode(ep_overlap)
    if mode == "none":
        return None
    return (f"ep_overlap {mode}: the trainer does not overlap the experts' all-to-all with "
            "another micro-batch's compute; --ep-overlap none costs what it runs")


def not_runnable(shape: ModelShape, layout: Layout, *, precision: str = "bf16",
                 ep_overlap="none") -> list[str]:
    """Each reason the trainer cannot run `layout` in `precision` (empty: it can), costed
    with `ep_overlap`."""
    why = [why for why in [precision_not_runnable(shape, precision)] if why]
    if shape.experts and layout.ep > 1 and (overlap := ep_overlap_not_runnable(ep_overlap)):
        why.append(overlap)
    if layout.cp > 1:
        why.append(f"cp {layout.cp}: context parallelism needs a GPU to verify: torch's "
                   "context_parallel (ring attention) has no CPU kernel, so the trainer, "
                   "tested on CPUs, does not run it yet (docs/trainer.md)")
    if layout.sharding not in RUNNABLE_SHARDING:
        why.append(f"{layout.sharding}: ZeRO-2 as DeepSpeed runs it (gradients reduce-"
                   "scattered every micro-batch) is not in the trainer; its FSDP2 shards "
                   "(fsdp, hybrid fsdp/N), keeps weights and gradients whole through a step "
                   "(zero1: parallelism.fsdp_keep_gathered) or replicates (ddp)")
    elif layout.sharding in ("fsdp", "zero1") and layout.dp == 1:
        why.append(f"{layout.sharding} over one data-parallel rank: the trainer runs that "
                   "unsharded (ddp)")
    if layout.recompute == "selective":
        why.append("recompute selective (Megatron's: the attention core recomputed): the "
                   "trainer's activation_checkpoint selective keeps attention and matmul "
                   "outputs and recomputes the element-wise ops (recompute op)")
    elif layout.recompute not in RUNNABLE_RECOMPUTE:
        why.append(f"recompute {layout.recompute}: the trainer recomputes "
                   f"{'|'.join(RUNNABLE_RECOMPUTE)} (activation_checkpoint "
                   f"{'|'.join(TRAINER_ACTIVATION_CHECKPOINT.values())})")
    chunks = layout.pp * layout.virtual_stages
    if shape.layers < chunks:
        why.append(f"{shape.layers} layers cannot give each of pp x virtual_stages = "
                   f"{chunks} pipeline chunks one")
    if shape.tie_embeddings and (layout.tp > 1 or layout.pp > 1):
        why.append("tied embeddings cannot be split by tp or pp (untie them to use either)")
    if shape.experts and layout.tp > 1:
        why.append(f"tp {layout.tp} with Mixture of Experts: the trainer's MoE layers run "
                   "with FSDP, ep and pp, not yet with tp")
    return why


def balanced_split(layers: int, chunks: int) -> list[int] | None:
    """Layers per pipeline chunk when they do not divide evenly (None when they do): the
    extra layers go to the middle chunks, so the first (embedding) and the last (output
    head) are the lighter ones, as Llama 3 split 126 layers over 16 stages (7, 8 x 14, 7)."""
    base, extra = divmod(layers, chunks)
    if not extra:
        return None
    middle = list(range(1, chunks - 1))[:extra]
    # One more than the middle takes goes first: the embedding is a lookup, the head a GEMM.
    heavier = set(middle) | ({0} if extra > len(middle) else set())
    return [base + (i in heavier) for i in range(chunks)]


def runnable_mask(shape: ModelShape, c: Candidates, *, precision: str = "bf16",
                  ep_overlap="none") -> np.ndarray:
    """The vectorized form of `not_runnable(...) == []`."""
    ok = (c.cp == 1) & (precision_not_runnable(shape, precision) is None)
    if shape.experts and ep_overlap_not_runnable(ep_overlap):
        ok &= c.ep == 1
    sharding = np.array([SHARDING.index(s) for s in RUNNABLE_SHARDING])
    ok &= np.isin(c.sharding, sharding)
    ok &= ~np.isin(c.sharding, [SHARDING.index("fsdp"), SHARDING.index("zero1")]) | (c.dp > 1)
    ok &= np.isin(c.recompute, [RECOMPUTE.index(r) for r in RUNNABLE_RECOMPUTE])
    ok &= shape.layers >= c.pp * c.virtual_stages
    if shape.tie_embeddings:
        ok &= (c.tp == 1) & (c.pp == 1)
    if shape.experts:
        ok &= c.tp == 1
    return ok
