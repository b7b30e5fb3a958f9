"""The trainer's activation_checkpoint "selective" is op-level (fm_pipeline/parallel/
activation_checkpoint.py: every matmul's and attention's output kept, the element-wise ops
recomputed); the planner costs it as recompute "op", and Megatron's attention-core
"selective" is not what the trainer runs."""

from __future__ import annotations

import pytest

from fm_pipeline.planner.shape import named_shape
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import Candidates, Layout
from fm_pipeline.planner.memory import layer_activations
from fm_pipeline.planner.runnable import not_runnable

from tests.planner.test_search import H100


def _acts(shape, tp: int):
    return layer_activations(shape, Candidates.from_layouts([Layout(tp=tp, dp=1)]),
                             dtype_bytes=2)


@pytest.mark.parametrize("tp", [1, 4])
def test_op_keeps_the_matmul_outputs_and_drops_norm_outputs_and_swiglu_products(tp):
    """Llama 3 8B, per token and layer in bf16 bytes, counted by hand from what SAC keeps:
    the layer input, the attention projection's and the down projection's outputs (whole
    on a tp rank), Q, K, V and the attention output, the gate and up outputs."""
    shape = named_shape("llama3-8b", seq_len=8192)
    h, kv, q, f = shape.hidden, shape.kv_dim, shape.q_dim, shape.ffn
    acts = _acts(shape, tp)
    tokens = shape.seq_len  # micro-batch 1
    kept = (2 * h / tp + 2 * h + (2 * q + 4 * kv + 2 * q) / tp + 4 * f / tp + 2 * h) * tokens
    none = acts.linear + acts.core
    assert float((none - acts.op_recomputed + acts.op_extra)[0]) == pytest.approx(kept)
    assert float(acts.op_extra[0]) < float(acts.op_recomputed[0])  # less than "none"


def test_op_fits_llama3_8b_at_8k_on_8_h100_where_none_does_not():
    """torchtitan trains Llama 3 8B at 8K with FSDP on 8 H100 under its op-level SAC; the
    planner's "none" (everything kept) does not fit one sequence a GPU, "op" does."""
    shape = named_shape("llama3-8b", seq_len=8192)

    def at(recompute):
        return estimate(shape, H100, Layout(dp=8, micro_batch=1, recompute=recompute,
                                            sharding="fsdp"), global_batch_tokens=16 * 8192)

    none, op, full = at("none"), at("op"), at("full")
    assert not none.fits and op.fits
    assert full.metrics["memory_gib_per_gpu"] < op.metrics["memory_gib_per_gpu"] \
        < none.metrics["memory_gib_per_gpu"]
    assert none.metrics["step_time_s"] < op.metrics["step_time_s"] < full.metrics["step_time_s"]


def test_megatron_selective_is_not_runnable_and_names_the_trainers_op():
    shape = named_shape("llama3-8b", seq_len=8192)
    (why,) = not_runnable(shape, Layout(dp=8, recompute="selective"))
    assert "attention core" in why and "recompute op" in why
    assert not not_runnable(shape, Layout(dp=8, recompute="op"))
