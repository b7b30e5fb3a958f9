"""Memory per GPU: model state by sharding level, activations by recomputation, the pipeline's
in-flight micro-batches, and a fragmentation margin. Vectorized over candidate layouts.

Activations per layer follow Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", section 4, Table 2), with tensor parallelism always paired
with sequence parallelism so every term divides by tp:

    GPT layer, no recomputation:  s b h (34 + 5 a s / h) / t   bytes
    selective (attention core recomputed): 34 s b h / t
    full (only the layer input kept):       2 s b h / t
    op (the trainer's selective: matmul and attention outputs kept, element-wise ops
        recomputed): none without the norms' outputs and SwiGLU's SiLU output and product,
        with the attention projection's and the MLP's down-projection outputs (s b h each,
        whole on every tp rank: they are kept before their reduce-scatter)
    half (every other layer fully recomputed): the mean of none and full

generalized term by term to grouped-query attention (K and V are kv_dim wide), SwiGLU
(gate, up, SiLU and product outputs: 8 s b ffn), no dropout masks, and flash attention
(no s^2 scores are ever stored). Context parallelism divides s by cp.

The first pipeline stage holds the most: p micro-batches of L/p layers in 1F1B, scaled by
(1 + (p-1)/(p v)) when interleaved, m micro-batches in GPipe. The last stage holds the
loss instead: for one micro-batch, bf16 logits, the fp32 log-softmax kept for the backward,
its gradient and the logits' gradient, 14 bytes a logit (what `cross_entropy(logits.float())`
allocates in the trainer and torchtitan; with a 128K vocabulary and long sequences the
largest single item, e.g. 55 GiB for 32K tokens of Llama 3 8B without tp). It peaks apart
from a recomputed layer's activations (the loss backward runs before any layer's). The
worse of the two stages is the GPU's need.

Model state (bytes per parameter, mixed precision as Megatron and torchtitan keep it):
bf16 weights 2, fp32 gradients 4, fp32 master weights + Adam moments 12. ZeRO-1 shards the
12, ZeRO-2 the 4 + 12, FSDP all 18 over the shard group (dp_shard x cp ranks), plus the two
gathered layers FSDP keeps in flight. FSDP under a pipeline runs as the trainer runs it
(torch.distributed.pipelining with reshard_after_forward=False): a stage's weights are
gathered at its first micro-batch and kept, its gradients accumulate unsharded in fp32 until
the last backward reduce-scatters them, so only the 12 optimizer bytes stay sharded.

Mixture of Experts: per-layer terms are the mean over dense and MoE layers. A rank holds
experts / ep of each MoE layer's routed experts, whole (not split by tp: expert tensor
parallelism 1, Megatron-Core's default), their state sharded over the tp x cp x shard
group / ep ranks that hold the same experts (ep folds over tp, cp and dp, layout.py). An MoE layer keeps, per token, its shared experts'
SwiGLU activations and, for each of its top-k copies (times the busiest rank's imbalance),
the dispatched input, the expert's SwiGLU activations and its output before the combine.

FP8 (fm_pipeline.planner.precision) keeps the linear layers' inputs as their 1-byte casts;
model state as BF16 training keeps it (FP8 primary weights and their transposes take the
BF16 weights' 2 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fm_pipeline.planner.layout import RECOMPUTE, SCHEDULES, SHARDING, Candidates
from fm_pipeline.planner.precision import get_precision
from fm_pipeline.planner.shape import ModelShape

GIB = 1024**3
FRAGMENTATION = 0.10  # caching-allocator fragmentation and transient buffers, x allocated
RUNTIME_RESERVED_GIB = 2.0  # CUDA context, NCCL buffers, cuBLAS workspaces (0 on CPU)
LOSS_BYTES_PER_LOGIT = 14  # bf16 logits 2, fp32 log-softmax 4, its gradient 4, the logits' 4

NONE, NORM_ACT, OP, SELECTIVE, HALF, FULL = (RECOMPUTE.index(x) for x in RECOMPUTE)
DDP, ZERO1, ZERO2, FSDP = (SHARDING.index(x) for x in SHARDING)
ONE_F_ONE_B, INTERLEAVED, GPIPE = (SCHEDULES.index(x) for x in SCHEDULES)


@dataclass(frozen=True)
class StateBytes:
    weights: float
    grads: float
    optimizer: float

    @classmethod
    def for_precision(cls, precision: str) -> StateBytes:
        if precision == "fp32":
            return cls(weights=4, grads=4, optimizer=8)  # the fp32 weights are the master copy
        return cls(weights=2, grads=4, optimizer=12)


@dataclass
class LayerActivations:
    """Bytes one layer keeps for one micro-batch on one GPU."""

    linear: np.ndarray  # everything but the attention scores
    core: np.ndarray  # softmax / dropout over the s x s scores (0 with flash attention)
    layer_input: np.ndarray  # what full recomputation keeps
    norm_act: np.ndarray  # of `linear`, what "norm_act" recomputes instead of keeping
    op_recomputed: np.ndarray  # of `linear`, what "op" recomputes instead of keeping
    op_extra: np.ndarray  # matmul outputs "op" keeps that `linear` does not count


def layer_activations(shape: ModelShape, c: Candidates, *, dtype_bytes: int,
                      fp8_inputs: bool = False,
                      sequence_parallel: bool = True) -> LayerActivations:
    """`fp8_inputs`: the linear layers' inputs are kept as their FP8 casts for the
    backward (1 byte instead of 2), as Transformer Engine and torchao's compiled casts do.
    `sequence_parallel` off (Megatron before 2022): what lies outside the tensor-parallel
    regions (norm inputs, the attention and MLP inputs, dropout masks) is held whole on
    every tp rank, Korthikanti's sbh (10 + 24/t) instead of 34 sbh / t."""
    unit = dtype_bytes / 2  # Korthikanti's counts are in 16-bit elements x 2 bytes
    saved = 1 if fp8_inputs else 2  # bytes of a kept linear-layer input, per element
    sb = c.micro_batch * shape.seq_len / c.cp
    h, kv, f = shape.hidden, shape.kv_dim, shape.ffn
    norms = 2 * 2 * h
    inputs = 2 * saved * h  # the attention's (QKV) input and the MLP's
    q = shape.q_dim  # hidden unless the heads are wider (attn_head_dim)
    attn = 2 * q + 2 * kv + 2 * kv + saved * q  # Q, K, V, projection input

    def swiglu(width):  # gate, up and SiLU outputs, and their product (the down input)
        return 6 * width + saved * width

    mlp = swiglu(f) if shape.mlp == "swiglu" else 2 * f + saved * f
    act = 0.0  # the routed experts' SiLU output and product; their gate and up outputs stay
    # The dense MLP's SiLU output and product (what "op" also recomputes).
    dense_act = 2 * f + saved * f if shape.mlp == "swiglu" else 0.0
    if shape.experts:
        ef = shape.expert_ffn
        copies = shape.top_k * shape.expert_imbalance
        routed = copies * (saved * h + swiglu(ef) + 2 * h)
        moe = 2 * h - saved * h + shape.shared_experts * swiglu(ef) + routed
        mlp = (1 - shape.moe_fraction) * mlp + shape.moe_fraction * moe
        act = shape.moe_fraction * copies * (2 * ef + saved * ef)
        dense_act = (1 - shape.moe_fraction) * dense_act + shape.moe_fraction * (
            shape.shared_experts * (2 * ef + saved * ef))
    masks = 2 * h if shape.dropout else 0  # one byte each, after attention and after the MLP
    outside = (norms + inputs) * unit + masks  # outside the tensor-parallel regions
    split = 1 if sequence_parallel else c.tp
    linear = sb * (outside * split + (attn + mlp) * unit) / c.tp
    if shape.flash_attention:
        core = np.zeros_like(linear)
    else:
        scores = shape.heads * c.micro_batch * (shape.seq_len / c.cp) * shape.seq_len
        per_score = 2 * unit + ((1 + 2 * unit) if shape.dropout else 0)
        core = scores * per_score / c.tp
    layer_input = 2 * unit * sb * h * split / c.tp
    # The norms' outputs are the attention's and the MLP's inputs.
    norm_act = sb * (inputs * unit * split + act * unit) / c.tp
    op_recomputed = norm_act + sb * dense_act * unit / c.tp
    # The attention projection's output replaces the second norm's input (the residual
    # sum, recomputed), the MLP's down projection's is kept besides: both whole per rank
    # (SAC keeps a row-parallel matmul's DTensor output, the partial sum of every token
    # before its reduce-scatter: tests/parallel/test_sac_under_tp.py).
    op_extra = sb * 2 * h * unit * (2 - split / c.tp)
    return LayerActivations(linear=linear, core=core, layer_input=layer_input,
                            norm_act=norm_act, op_recomputed=op_recomputed, op_extra=op_extra)


@dataclass
class MemoryArrays:
    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    working: np.ndarray  # FSDP's gathered layers, the layer being recomputed or the loss
    total_gib: np.ndarray  # with fragmentation margin and runtime reserve
    capacity_gib: float
    stage_params: np.ndarray  # parameters on the fuller stage's GPU (experts included)
    layers_per_rank: np.ndarray
    stage_expert_params: np.ndarray  # the routed experts among them (split by ep)
    stage_linear_params: np.ndarray  # the blocks' linear-layer weights among them

    @property
    def fits(self) -> np.ndarray:
        return self.total_gib <= self.capacity_gib


def stage_layers(shape: ModelShape, c: Candidates) -> np.ndarray:
    """Layers on the fullest pipeline rank (uneven splits round up)."""
    per_chunk = -(-shape.layers // (c.pp * c.virtual_stages))
    return per_chunk * c.virtual_stages


def memory_per_gpu(shape: ModelShape, c: Candidates, *, global_batch_tokens: int,
                   capacity_gib: float, precision: str = "bf16", on_cpu: bool = False,
                   sequence_parallel: bool = True) -> MemoryArrays:
    prec = get_precision(precision)
    dtype_bytes = prec.act_bytes
    state = StateBytes.for_precision(prec.compute_dtype)
    p = shape.params()
    layer_params = (p.per_layer - p.per_layer_norms) / c.tp + p.per_layer_norms
    layers = stage_layers(shape, c)
    expert_layer = p.routed / shape.layers / c.ep  # this rank's experts, mean per layer
    experts = layers * expert_layer
    moe_layer_experts = p.routed / max(shape.moe_layers, 1) / c.ep  # one MoE layer's, gathered
    embedding = p.embedding / c.tp + p.positions
    head = np.where(shape.tie_embeddings & (c.pp == 1), 0.0, p.embedding / c.tp) + p.final_norm
    single = c.pp == 1
    first_params = layers * (layer_params + expert_layer) + embedding + np.where(single, head, 0.0)
    last_params = layers * (layer_params + expert_layer) + head

    shard = (c.dp_shard * c.cp).astype(np.float64)
    expert_shard = c.tp * shard / c.ep  # ranks holding the same experts (ep folds over tp)
    # FSDP inside a pipeline keeps weights gathered and gradients unsharded all step.
    fsdp_resharding = (c.sharding == FSDP) & single

    def sharded(params, over):
        w = params * state.weights
        g = params * state.grads
        o = params * state.optimizer
        g = np.where((c.sharding == ZERO2) | fsdp_resharding, g / over, g)
        o = np.where(c.sharding == DDP, o, o / over)
        w = np.where(fsdp_resharding, w / over, w)
        return w, g, o

    def state_bytes(params):
        dense = sharded(params - experts, shard)
        routed = sharded(experts, expert_shard)
        return tuple(a + b for a, b in zip(dense, routed, strict=True))

    acts = layer_activations(shape, c, dtype_bytes=dtype_bytes, fp8_inputs=prec.fp8,
                             sequence_parallel=sequence_parallel)
    everything = acts.linear + acts.core
    stored = np.select(
        [c.recompute == NONE, c.recompute == NORM_ACT, c.recompute == OP,
         c.recompute == SELECTIVE, c.recompute == HALF],
        [everything, everything - acts.norm_act,
         everything - acts.op_recomputed + acts.op_extra, acts.linear,
         (everything + acts.layer_input) / 2],
        default=acts.layer_input,
    )
    recompute_working = np.select(
        [c.recompute == NORM_ACT, c.recompute == OP, c.recompute == SELECTIVE,
         c.recompute >= HALF],
        [acts.norm_act, acts.op_recomputed, acts.core, everything], default=0.0
    )
    fsdp_working = np.where(
        fsdp_resharding, 2 * (layer_params + moe_layer_experts) * (state.weights + state.grads),
        0.0
    )
    stage_linear = layers * ((p.per_layer - p.per_layer_norms) / c.tp + expert_layer)

    m = global_batch_tokens // shape.seq_len // (c.dp * c.micro_batch)
    pp = c.pp.astype(np.float64)
    in_flight = np.select(
        [single, c.schedule == GPIPE, c.schedule == INTERLEAVED],
        [1.0, m, np.minimum(m, pp) + (pp - 1) / c.virtual_stages],
        default=np.minimum(m, pp),
    )
    sb = c.micro_batch * shape.seq_len / c.cp
    # One micro-batch's loss on the last stage (vocabulary split by tp, loss_parallel): the
    # final norm's input and output, and per logit the bf16 logits, the fp32 log-softmax
    # the backward keeps, its gradient and the logits' gradient. Recomputation cannot
    # shrink it, and no layer is being recomputed while it is alive.
    loss_working = sb * (4 * shape.hidden * dtype_bytes / 2
                         + LOSS_BYTES_PER_LOGIT * shape.vocab) / c.tp
    first_acts = in_flight * layers * stored
    last_acts = np.where(c.schedule == GPIPE, m, 1) * layers * stored

    first = [*state_bytes(first_params), first_acts]
    last = [*state_bytes(last_params), last_acts]
    last_working = fsdp_working + np.maximum(recompute_working, loss_working)
    first_working = np.where(single, last_working, fsdp_working + recompute_working)
    first_total = sum(first) + first_working
    last_total = sum(last) + last_working
    use_first = first_total >= last_total
    parts = [np.where(use_first, a, b) for a, b in zip(first, last, strict=True)]
    working = np.where(use_first, first_working, last_working)
    allocated = np.maximum(first_total, last_total)
    reserved = 0.0 if on_cpu else RUNTIME_RESERVED_GIB
    total_gib = allocated * (1 + FRAGMENTATION) / GIB + reserved
    return MemoryArrays(
        weights=parts[0],
        grads=parts[1],
        optimizer=parts[2],
        activations=parts[3],
        working=working,
        total_gib=total_gib,
        capacity_gib=capacity_gib,
        stage_params=np.where(use_first, first_params, last_params),
        layers_per_rank=layers,
        stage_expert_params=experts,
        stage_linear_params=stage_linear,
    )
