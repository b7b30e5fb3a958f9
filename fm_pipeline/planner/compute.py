"""Compute time of one micro-batch through one layer (and the output layer) on one GPU,
from the shapes of its matrix multiplications. Vectorized over candidate layouts.

A GEMM (M x K) @ (K x N) runs at the accelerator's best achieved matmul rate
(`matmul_efficiency` x peak) scaled by two losses that grow as tensor/context parallelism
shrinks the matrices:
  - wave quantization: 128x128 output tiles are spread over the SMs in waves; a last,
    partly filled wave idles the rest (tiles / (waves x SMs));
  - a short inner dimension: K / (K + 64) (prologue/epilogue and operand loads amortize
    over K; this is why a head_dim-128 attention GEMM runs well below a 8192-wide one);
and never faster than moving its operands through HBM (roofline).

Attention scores (QK^T, softmax x V) are batched GEMMs of head_dim inner size; flash
attention skips the masked half of causal scores and recomputes them in backward
(2.5 x forward), unfused attention computes the full square (backward 2 x forward).
Element-wise work (norms, activations, residuals, dropout, softmax) is memory-bound:
ELEMENTWISE_PASSES x the layer's activation bytes through HBM forward, twice that backward.

Under an FP8 recipe (fm_pipeline.planner.precision) the blocks' linear GEMMs run at the FP8
peak, read 1-byte operands and write BF16; casting their operands is memory traffic of its
own: activations forward, output gradients backward, weights reported apart (`weight_cast`)
because Transformer Engine casts them once per step and torchao per micro-batch.

An MoE layer (per-layer times are the mean over dense and MoE layers) runs its router and
shared experts on the rank's tokens (tp-split like the dense MLP), and its local experts as
experts / ep grouped GEMMs: each gets top_k x tokens x ep / experts rows, times the busiest
rank's imbalance, so small experts or few tokens per expert lose GEMM efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fm_pipeline.accelerators import Accelerator
from fm_pipeline.planner.layout import Candidates
from fm_pipeline.planner.memory import layer_activations
from fm_pipeline.planner.precision import get_precision
from fm_pipeline.planner.shape import ModelShape

TILE = 128
K_HALF = 256  # inner dimension at which a GEMM tile reaches half its asymptotic rate
MEMORY_BW_EFFICIENCY = 0.9  # device-to-device copy: 3.0 of an H100 SXM's 3.35 TB/s
ELEMENTWISE_PASSES = 2.0  # each stored activation byte: written by its op, read by the next


def gemm_time(acc: Accelerator, peak: float, M, N, K, *, batch=1, dtype_bytes: float = 2,
              out_bytes: float | None = None):
    """Seconds for `batch` GEMMs of (M x K) @ (K x N) on one device (operands `dtype_bytes`
    each, the result `out_bytes`: FP8 GEMMs read 1 byte and write BF16)."""
    M, N, K = (np.asarray(x, dtype=np.float64) for x in (M, N, K))
    tiles = np.ceil(M / TILE) * np.ceil(N / TILE) * batch
    waves = np.ceil(tiles / acc.sm_count)
    rate = peak * acc.matmul_efficiency * (tiles / (waves * acc.sm_count)) * (K / (K + K_HALF))
    compute = 2 * M * N * K * batch / rate
    out = dtype_bytes if out_bytes is None else out_bytes
    memory = ((dtype_bytes * (M * K + K * N) + out * M * N) * batch
              / (acc.memory_bw_gbps * 1e9 * MEMORY_BW_EFFICIENCY))
    return np.maximum(compute, memory)


def _fwd_bwd(acc, peak, M, N, K, dtype_bytes):
    """Forward, input-gradient and weight-gradient times of one linear layer."""
    fwd = gemm_time(acc, peak, M, N, K, dtype_bytes=dtype_bytes)
    dgrad = gemm_time(acc, peak, M, K, N, dtype_bytes=dtype_bytes)
    wgrad = gemm_time(acc, peak, K, N, M, dtype_bytes=dtype_bytes)
    return fwd, dgrad, wgrad


@dataclass
class LayerTimes:
    """Seconds per micro-batch on one GPU."""

    fwd: np.ndarray  # one layer forward: GEMMs, attention, element-wise
    bwd: np.ndarray  # one layer backward, all of it
    wgrad: np.ndarray  # the weight-gradient GEMMs within bwd (TP backward comm hides behind them)
    attn_fwd: np.ndarray  # attention core forward (what selective recomputation redoes)
    norm_act_fwd: np.ndarray  # norms and the experts' SwiGLU forward (what "norm_act" redoes)
    op_fwd: np.ndarray  # norms, RoPE and every SwiGLU's element-wise forward ("op" redoes)
    head_fwd: np.ndarray  # output layer + loss
    head_bwd: np.ndarray
    weight_cast: np.ndarray | float = 0.0  # FP8: casting one layer's weights (in fwd + bwd)


def _moe_gemms(shape: ModelShape, c: Candidates, gemms, tokens) -> list:
    """Router, shared experts and local routed experts of the MoE layers, weighted by their
    share of the layers. `tokens`: this rank's (the sequence-parallel share)."""
    share, h, ef = shape.moe_fraction, shape.hidden, shape.expert_ffn
    out = [gemms(((shape.experts, h),), rows=tokens, share=share, linear=False)]  # router
    if shape.shared_experts:
        width = shape.shared_experts * ef / c.tp
        out.append(gemms(((2 * width, h), (h, width)), share=share))
    local = shape.experts / c.ep
    rows = tokens * shape.top_k * shape.expert_imbalance / local
    out.append(gemms(((2 * ef, h), (h, ef)), rows=rows, batch=local, share=share))
    return out


def layer_times(
    shape: ModelShape, acc: Accelerator, c: Candidates, *, precision: str = "bf16",
    sequence_parallel: bool = True,
) -> LayerTimes:
    prec = get_precision(precision)
    dtype_bytes = prec.act_bytes
    peak = acc.peak_flops(prec.compute_dtype)
    hbm = acc.memory_bw_gbps * 1e9 * MEMORY_BW_EFFICIENCY
    t = c.tp.astype(np.float64)
    M = (
        c.micro_batch * shape.seq_len / c.cp
    )  # tokens per micro-batch on this rank (gathered over tp)
    h, kv, f = shape.hidden, shape.kv_dim, shape.ffn
    up_width = 2 * f if shape.mlp == "swiglu" else f  # gate and up fused
    casts = [0.0, 0.0, 0.0]  # FP8 cast bytes: activations (fwd), weights, output grads (bwd)

    def gemms(shapes, rows=M, batch=1, share=1.0, linear=True):
        """Forward, input-gradient, weight-gradient seconds of linear layers (N, K) over
        `rows` tokens; a block's linear layers run in FP8 under an FP8 recipe."""
        fp8 = linear and prec.fp8
        rate = acc.peak_flops("fp8") if fp8 else peak
        operand = 1 if fp8 else dtype_bytes
        times = [0.0, 0.0, 0.0]
        for N, K in shapes:
            for j, (m_, n_, k_) in enumerate(((rows, N, K), (rows, K, N), (K, N, rows))):
                times[j] = times[j] + share * gemm_time(acc, rate, m_, n_, k_, batch=batch,
                                                        dtype_bytes=operand, out_bytes=dtype_bytes)
            if fp8:
                for j, (a, b) in enumerate(((rows, K), (K, N), (rows, N))):
                    casts[j] = casts[j] + share * batch * a * b * prec.cast[j]
        return times

    q = shape.q_dim
    attn_gemms = gemms((((q + 2 * kv) / t, h), (h, q / t)))
    dense_share = 1 - shape.moe_fraction if shape.experts else 1.0
    mlp_gemms = gemms(((up_width / t, h), (h, f / t)), share=dense_share)
    parts = [attn_gemms, mlp_gemms]
    if shape.experts:
        parts += _moe_gemms(shape, c, gemms, M / t)
    fwd, dgrad, wgrad = (sum(p[j] for p in parts) for j in range(3))
    # FP8 casts are memory-bound passes: activations before the forward GEMMs, output
    # gradients before the backward ones; weights apart (cached across micro-batches or not).
    cast_fwd, weight_cast, cast_bwd = (b / hbm for b in casts)

    # Attention scores: per (sequence, head) a (s_local x s) @ (s x head_dim) pair.
    heads_local = shape.heads / t
    s_local, s_kv = shape.seq_len / c.cp, shape.seq_len
    qk_dim, v_dim = shape.score_dims
    batch = c.micro_batch * heads_local
    scores = gemm_time(acc, peak, s_local, s_kv, qk_dim, batch=batch, dtype_bytes=dtype_bytes)
    values = gemm_time(acc, peak, s_local, v_dim, s_kv, batch=batch, dtype_bytes=dtype_bytes)
    causal_share = 0.5 if shape.flash_attention else 1.0
    attn_fwd = (scores + values) * causal_share
    attn_bwd = attn_fwd * (2.5 if shape.flash_attention else 2.0)

    # Without sequence parallelism norms, residuals and dropout run on the whole sequence on
    # every tp rank (the activations outside the tensor-parallel regions are not split).
    acts = layer_activations(shape, c, dtype_bytes=dtype_bytes,
                             sequence_parallel=sequence_parallel)
    elem_fwd = ELEMENTWISE_PASSES * (acts.linear + acts.core) / hbm
    core_elem_fwd = ELEMENTWISE_PASSES * acts.core / hbm
    norm_act_fwd = ELEMENTWISE_PASSES * acts.norm_act / hbm
    op_fwd = ELEMENTWISE_PASSES * acts.op_recomputed / hbm

    head_fwd, head_dgrad, head_wgrad = _fwd_bwd(acc, peak, M, shape.vocab / t, h, dtype_bytes)
    loss = 3 * 4 * M * shape.vocab / t / hbm  # fp32 logits: softmax, loss and its gradient
    return LayerTimes(
        fwd=fwd + attn_fwd + elem_fwd + cast_fwd,
        bwd=dgrad + wgrad + attn_bwd + 2 * elem_fwd + cast_bwd,
        wgrad=wgrad,
        attn_fwd=attn_fwd + core_elem_fwd,
        norm_act_fwd=norm_act_fwd,
        op_fwd=op_fwd,
        head_fwd=head_fwd + loss,
        head_bwd=head_dgrad + head_wgrad + loss,
        weight_cast=weight_cast,
    )
