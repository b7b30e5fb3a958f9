"""Time of one optimizer step, MFU and HFU, and where the time goes. Vectorized over
candidate layouts: `evaluate` scores one layout or thirty thousand in the same pass.

    step = (m + (p - 1) / v) x t_micro  +  exposed data-parallel comm  +  optimizer

t_micro is one micro-batch through the slowest pipeline rank (its layers, the output layer,
recomputation, and the communication that cannot hide):
  - tensor parallel (with sequence parallelism; `sequence_parallel=False` for Megatron
    before 2022: all-reduces of the same bytes, norms and dropout unsplit; `tp_overlap=False`
    before its overlap with compute, 2023: nothing hidden):
    per layer 2 all-gathers + 2 reduce-scatters
    of the s x b x h activation forward, the same backward (Korthikanti et al. 2022); the
    forward ones and a recomputed forward's are exposed; backward, the all-gathers feeding
    the row-parallel layers are exposed and the reduce-scatters hide behind the
    weight-gradient GEMMs (Megatron overlaps them);
  - context parallel: an all-gather of K and V forward, a reduce-scatter of their gradients
    backward (the all-gather variant Llama 3 uses), exposed;
  - pipeline point-to-point: activation forward, gradient backward, per virtual stage.
The bubble is (p-1)/v micro-batch times: a fraction (p-1)/(v m + p - 1) of the step
(Narayanan et al. 2021; v = 1 is plain 1F1B). Data-parallel traffic per step: DDP
all-reduces fp32 gradients; ZeRO-1 reduce-scatters them and all-gathers updated bf16
weights; ZeRO-2 reduce-scatters every micro-batch; FSDP all-gathers weights forward and
backward and reduces-scatters gradients every micro-batch, except under a pipeline, where
(as the trainer runs it: torch.distributed.pipelining keeps an FSDP stage unsharded and
skips gradient sync until the last backward) it gathers once and reduce-scatters once per
step, like ZeRO-1. With overlap (modern Megatron,
torchtitan) only what exceeds the backward (or forward) compute it hides behind is exposed,
and never less than the last layer's bucket.

FP8 (fm_pipeline.planner.precision): the blocks' GEMMs and their casts are in the layer
times; weights are gathered in FP8 where the recipe does (tensorwise); a weight-cast pass
runs every micro-batch under FSDP (torchao) and once per step otherwise (Transformer
Engine's cached FP8 weights, charged with the optimizer step). MFU and HFU stay against the
BF16 peak.

Expert parallelism: per MoE layer and micro-batch, the rank's top-k token copies are
dispatched and combined all-to-all over the ep group forward, and again backward (and once
more per recomputed forward); exposed, as in torchtitan and Megatron-Core without their
optional overlap. `ep_overlap` "1f1b" is Megatron-Core's (--overlap-moe-expert-parallel-comm):
in the pipeline's steady state a micro-batch's forward runs beside another's backward, each
one's all-to-all behind the other's compute, while the first stage's warm-up forwards and
cool-down backwards have no partner and stay exposed; of what pairs, EP_OVERLAP_1F1B hides
(fitted on Megatron's published pair, literature.py MOEZOO25). "dualpipe" (DeepSeek-V3's
DualPipe) hides it all behind compute. A shape with
node-limited routing sends each token over the network once per node it reaches. The ep
group is ep consecutive ranks of a stage, folded over tp, cp and dp (Megatron-Core's expert
rank order etp-ep-edp-pp, expert tp 1); expert gradients and weights move over the tp x cp x
shard group / ep ranks that hold the same experts, every ep-th rank (with tp = cp = 1 the
trainer's expert FSDP mesh).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.collectives import (
    all_reduce_time,
    all_to_all_time,
    group_link,
    p2p_time,
    ring_pass_time,
)
from fm_pipeline.planner.compute import MEMORY_BW_EFFICIENCY, layer_times
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.layout import Candidates
from fm_pipeline.planner.memory import (
    DDP,
    FSDP,
    FULL,
    GPIPE,
    HALF,
    INTERLEAVED,
    NORM_ACT,
    OP,
    SELECTIVE,
    ZERO2,
    MemoryArrays,
    memory_per_gpu,
)
from fm_pipeline.planner.precision import get_precision
from fm_pipeline.planner.shape import ModelShape

EP_OVERLAPS = ("none", "1f1b", "dualpipe")
# Share of the paired all-to-all that Megatron-Core's 1F1B overlap hides: fitted so that the
# planner's ratio of Qwen3-235B's step without and with it matches the published 19.7 s /
# 17.6 s (MOEZOO25, the same layout both ways). Communication kernels take SMs from the
# compute they hide behind, and a layer's dispatch waits on its own router: far from all of
# it. Checked against Megatron-Bridge's DeepSeek-V3 row, which was not used to fit it.
EP_OVERLAP_1F1B = 0.3
GRAD_REDUCE_BYTES = 4  # fp32 gradient reduction (torchtitan's reduce_dtype, Megatron's default)
OPTIMIZER_BYTES_PER_PARAM = 34  # AdamW: read/write master, grad, two moments, write bf16 copy


@dataclass
class Evaluation:
    """Per-candidate predictions (arrays aligned with the Candidates evaluated)."""

    memory: MemoryArrays
    microbatches: np.ndarray
    step_time_s: np.ndarray
    compute_s: np.ndarray  # per step, on the slowest pipeline rank
    tp_comm_s: np.ndarray  # exposed, per step
    cp_comm_s: np.ndarray
    pp_comm_s: np.ndarray
    dp_comm_s: np.ndarray
    ep_comm_s: np.ndarray
    bubble_s: np.ndarray
    optimizer_s: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s: np.ndarray
    tp_level: np.ndarray  # how far each group reaches (collectives.LEVEL_NAMES)
    cp_level: np.ndarray
    pp_level: np.ndarray
    dp_level: np.ndarray
    ep_level: np.ndarray

    @property
    def exposed_comm_s(self) -> np.ndarray:
        return self.tp_comm_s + self.cp_comm_s + self.pp_comm_s + self.dp_comm_s + self.ep_comm_s

    @property
    def fits(self) -> np.ndarray:
        return self.memory.fits

    def fraction(self, part: np.ndarray) -> np.ndarray:
        return part / self.step_time_s


def ep_overlap_mode(value) -> str:
    """"none", "1f1b" or "dualpipe"; True and False are "dualpipe" and "none"."""
    if isinstance(value, bool) or value is None:
        return "dualpipe" if value else "none"
    if value not in EP_OVERLAPS:
        raise PlanInputError("ep_overlap", f"must be one of {', '.join(EP_OVERLAPS)}, "
                             f"got {value!r}")
    return value


def paired_share(c: Candidates, m: np.ndarray) -> np.ndarray:
    """Share of the first pipeline stage's micro-batch chunks that run forward beside another's
    backward: all but its warm-up (Megatron-Core's schedule: pp - 1 forwards, or 2 (pp - 1)
    + (v - 1) pp interleaved; with no pipeline, the first forward) and as many cool-down
    backwards. GPipe runs all forwards before any backward: nothing pairs."""
    v = c.virtual_stages.astype(np.float64)
    pp = c.pp.astype(np.float64)
    chunks = np.maximum(m * v, 1.0)
    warmup = np.select([c.pp == 1, c.schedule == INTERLEAVED],
                       [1.0, 2 * (pp - 1) + (v - 1) * pp], default=pp - 1)
    share = 1.0 - np.minimum(warmup, chunks) / chunks
    return np.where(c.schedule == GPIPE, 0.0, share)


def _hides(comm, window, buckets):
    """Exposed part of `comm` overlapped with `window` of compute; the last bucket never hides."""
    return np.maximum(comm - window, comm / np.maximum(buckets, 1))


def evaluate(shape: ModelShape, cluster: ClusterConfig, c: Candidates, *, global_batch_tokens: int,
             precision: str = "bf16", dp_overlap: bool = True, ep_overlap: bool | str = "none",
             sequence_parallel: bool = True, tp_overlap: bool = True) -> Evaluation:
    mode = ep_overlap_mode(ep_overlap)
    acc = cluster.accelerator
    on_cpu = acc.name.startswith("cpu")
    prec = get_precision(precision)
    dtype_bytes = prec.act_bytes
    mem = memory_per_gpu(shape, c, global_batch_tokens=global_batch_tokens,
                         capacity_gib=acc.memory_gib, precision=precision, on_cpu=on_cpu,
                         sequence_parallel=sequence_parallel)
    lt = layer_times(shape, acc, c, precision=precision, sequence_parallel=sequence_parallel)
    layers = mem.layers_per_rank.astype(np.float64)
    m = (global_batch_tokens // shape.seq_len // (c.dp * c.micro_batch)).astype(np.float64)
    v = c.virtual_stages.astype(np.float64)
    pp = c.pp.astype(np.float64)

    redone = np.select([c.recompute == FULL, c.recompute == HALF], [1.0, 0.5], default=0.0)
    recompute = (redone * lt.fwd + np.where(c.recompute == SELECTIVE, lt.attn_fwd, 0.0)
                 + np.where(c.recompute == NORM_ACT, lt.norm_act_fwd, 0.0)
                 + np.where(c.recompute == OP, lt.op_fwd, 0.0))
    fwd_window = layers * lt.fwd
    bwd_window = layers * (lt.bwd + recompute)
    compute_mb = fwd_window + bwd_window + lt.head_fwd + lt.head_bwd
    # FP8 weight casts: torchao casts the gathered weights every micro-batch under FSDP;
    # Transformer Engine caches them and casts once per step (charged with the optimizer).
    weight_casts = layers * lt.weight_cast
    compute_mb = compute_mb + np.where(c.sharding == FSDP, weight_casts, 0.0)

    # Tensor parallel: 4 ring passes of the gathered activation per layer and direction.
    tokens = c.micro_batch * shape.seq_len / c.cp
    act_bytes = tokens * shape.hidden * dtype_bytes
    tp_link = group_link(cluster, c.tp, 1)
    tp_pass = ring_pass_time(act_bytes, c.tp, tp_link)
    tp_fwd = 4 * tp_pass * (1 + redone)
    # Backward: the gradient all-gather before each row-parallel layer is needed at once;
    # the reduce-scatters after the column-parallel ones hide behind weight gradients.
    # Without sequence parallelism (Megatron before 2022) two all-reduces; without the
    # overlap (Megatron before Transformer Engine's, 2023) nothing is hidden.
    tp_bwd = 2 * tp_pass + np.maximum(2 * tp_pass - lt.wgrad, 0.0)
    if not (sequence_parallel and tp_overlap):
        tp_bwd = 4 * tp_pass
    tp_mb = layers * (tp_fwd + tp_bwd)

    # Context parallel: gather K and V (this rank's kv heads) forward, scatter their grads.
    kv_bytes = 2 * c.micro_batch * shape.seq_len * (shape.kv_dim / c.tp) * dtype_bytes
    cp_link = group_link(cluster, c.cp, c.tp)
    cp_pass = ring_pass_time(kv_bytes, c.cp, cp_link)
    cp_mb = layers * cp_pass * (2 + redone)

    # Pipeline: each virtual stage sends an activation forward and a gradient backward.
    pp_link = group_link(cluster, c.pp, c.tp * c.cp)
    p2p = p2p_time(act_bytes / c.tp, pp_link, active=c.pp > 1)
    pp_mb = 2 * v * p2p

    # Expert parallel: ep consecutive ranks of a stage, folded over tp, cp and dp (Megatron-
    # Core's expert rank order etp-ep-edp-pp: a pipeline's stages are outermost, so an ep
    # group stays on as few nodes as it can; with tp = cp = pp = 1 it is the trainer's order).
    ep_stride = 1
    ep_link = group_link(cluster, c.ep, ep_stride)
    ep_mb = np.zeros(len(c))
    if shape.experts:
        routed = tokens / c.tp * shape.top_k * shape.expert_imbalance * shape.hidden
        per_node = np.clip(cluster.gpus_per_node // ep_stride, 1, c.ep)
        remote = None
        if shape.route_nodes:
            # Once per destination node, at most route_nodes of them, this node's not sent.
            nodes = np.maximum(c.ep / per_node, 1)
            sends = np.minimum(shape.route_nodes, nodes) * (nodes - 1) / nodes
            remote = np.minimum(sends / shape.top_k, (c.ep - per_node) / c.ep) * routed

        def a2a(elem_bytes):
            return all_to_all_time(routed * elem_bytes, c.ep, ep_link, per_node=per_node,
                                   intra_gbps=cluster.intra_node_gbps,
                                   outside_bytes=None if remote is None else remote * elem_bytes)
        # Forward dispatch (FP8 under DeepSeek-V3's recipe) and combine, again for each
        # recomputed forward; backward, the gradients both ways in BF16.
        dispatch, combine = a2a(prec.dispatch_bytes), a2a(dtype_bytes)
        ep_mb = shape.moe_fraction * layers * ((1 + redone) * (dispatch + combine) + 2 * combine)
        # Overlapped with the other micro-batch's compute: at most that compute hides.
        hideable = np.minimum(ep_mb, compute_mb)
        if mode == "dualpipe":
            ep_mb = ep_mb - hideable
        elif mode == "1f1b":
            ep_mb = ep_mb - paired_share(c, m) * EP_OVERLAP_1F1B * hideable

    t_micro = compute_mb + tp_mb + cp_mb + pp_mb + ep_mb
    bubble_slots = np.where(c.schedule == GPIPE, pp - 1, (pp - 1) / v)
    pipeline_s = (m + bubble_slots) * t_micro

    # Data parallel over dp x cp ranks (context-parallel ranks hold the same weights).
    gpn = cluster.gpus_per_node
    group = c.tp * c.cp * c.pp * c.dp
    shard_size = c.dp_shard * c.cp
    per_node_cp = np.clip(gpn // c.tp, 1, c.cp)
    per_node_dp = np.clip(gpn // (c.tp * c.cp * c.pp), 1, c.dp_shard)
    shard_link = group_link(cluster, shard_size, c.tp, span=c.tp * c.cp * c.pp * c.dp_shard,
                            per_node=per_node_cp * per_node_dp)
    replicas = c.dp // c.dp_shard
    replica_link = group_link(cluster, replicas, c.tp * c.cp * c.pp * c.dp_shard)
    params = mem.stage_params
    experts = mem.stage_expert_params
    # Weights gathered for compute: the blocks' linear layers in FP8 where the recipe does.
    linear_dense = mem.stage_linear_params - experts
    gather_dense = (linear_dense * prec.gather_bytes
                    + (params - experts - linear_dense) * dtype_bytes)
    # One collective per layer (FSDP units, gradient buckets): latency is paid per layer.
    # Dense weights over the shard group; an MoE model's routed experts over the tp x cp x
    # shard group / ep ranks that hold the same ones: every ep-th rank of the stage's fold.
    dense, expert = params - experts, experts
    # A dense model has no expert collectives (size 1: neither bytes nor latency).
    expert_shard = np.maximum(c.tp * shard_size // c.ep, 1) if shape.experts else np.ones(len(c))
    expert_link = group_link(cluster, expert_shard, c.ep, span=c.tp * shard_size,
                             per_node=np.clip(gpn // c.ep, 1, expert_shard))
    rs_grads = (ring_pass_time(dense * GRAD_REDUCE_BYTES, shard_size, shard_link, calls=layers)
                + ring_pass_time(expert * GRAD_REDUCE_BYTES, expert_shard, expert_link,
                                 calls=layers))
    ag_weights = (ring_pass_time(gather_dense, shard_size, shard_link, calls=layers)
                  + ring_pass_time(expert * prec.gather_bytes, expert_shard, expert_link,
                                   calls=layers))
    shard_grads = (dense / shard_size + expert / expert_shard) * GRAD_REDUCE_BYTES
    across_replicas = all_reduce_time(shard_grads, replicas, replica_link, calls=layers)
    ddp_all_reduce = (
        all_reduce_time(dense * GRAD_REDUCE_BYTES, shard_size, shard_link, calls=layers)
        + all_reduce_time(expert * GRAD_REDUCE_BYTES, expert_shard, expert_link, calls=layers)
        + across_replicas)
    fwd_hidden = _hides(ag_weights, fwd_window, layers)
    grad_once = _hides(rs_grads, bwd_window, layers) + across_replicas
    if dp_overlap:
        per_micro_fsdp = fwd_hidden + _hides(ag_weights + rs_grads, bwd_window, layers)
        dp_s = np.select(
            [c.sharding == DDP, c.sharding == ZERO2, c.sharding == FSDP],
            [_hides(ddp_all_reduce, bwd_window, layers),
             m * _hides(rs_grads, bwd_window, layers) + across_replicas + fwd_hidden,
             m * per_micro_fsdp + across_replicas],
            default=grad_once + fwd_hidden,
        )
    else:
        dp_s = np.select(
            [c.sharding == DDP, c.sharding == ZERO2, c.sharding == FSDP],
            [ddp_all_reduce, m * rs_grads + across_replicas + ag_weights,
             m * (2 * ag_weights + rs_grads) + across_replicas],
            default=rs_grads + across_replicas + ag_weights,
        )
    # FSDP under a pipeline: once per step, as ZeRO-1 (the default branch of the selects).
    once = (grad_once + fwd_hidden) if dp_overlap else (rs_grads + across_replicas + ag_weights)
    dp_s = np.where((c.sharding == FSDP) & (c.pp > 1), once, dp_s)
    dp_s = np.where(c.dp * c.cp > 1, dp_s, 0.0)  # one replica of the weights: nothing to reduce

    optimizer_params = np.where(c.sharding == DDP, params,
                                dense / shard_size + expert / expert_shard)
    hbm = acc.memory_bw_gbps * 1e9 * MEMORY_BW_EFFICIENCY
    optimizer_s = optimizer_params * OPTIMIZER_BYTES_PER_PARAM / hbm
    optimizer_s = optimizer_s + np.where(c.sharding == FSDP, 0.0, weight_casts)

    step = pipeline_s + dp_s + optimizer_s
    tokens_per_step = global_batch_tokens
    gpus = group.astype(np.float64)
    peak = acc.peak_flops(prec.compute_dtype)  # FP8 runs quote MFU against BF16's peak
    model_flops = float(shape.model_flops_per_token()) * tokens_per_step
    attn_fwd_per_token = shape.attention_flops_per_token() / 3.0  # the forward's third
    layer_fwd_per_token = 2.0 * shape.layers * shape.layer_matmul_weights() + attn_fwd_per_token
    recompute_per_token = redone * layer_fwd_per_token + np.where(
        c.recompute == SELECTIVE, attn_fwd_per_token, 0.0)
    hardware_flops = model_flops + recompute_per_token * tokens_per_step
    return Evaluation(
        memory=mem, microbatches=m, step_time_s=step,
        compute_s=m * compute_mb, tp_comm_s=m * tp_mb, cp_comm_s=m * cp_mb, pp_comm_s=m * pp_mb,
        dp_comm_s=dp_s, ep_comm_s=m * ep_mb, bubble_s=bubble_slots * t_micro,
        optimizer_s=optimizer_s,
        mfu=model_flops / (step * gpus * peak), hfu=hardware_flops / (step * gpus * peak),
        tokens_per_s=tokens_per_step / step,
        tp_level=tp_link.level, cp_level=cp_link.level, pp_level=pp_link.level,
        dp_level=np.maximum(shard_link.level, np.where(replicas > 1, replica_link.level, 0)),
        ep_level=ep_link.level,
    )
