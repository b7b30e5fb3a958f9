"""Parallelism search: every valid (tp, cp, pp, dp, micro-batch, interleaving, recomputation,
sharding) for a GPU count, scored in one vectorized pass, non-fitting ones dropped, the rest
ranked by predicted throughput.

    from fm_pipeline.planner.search import search
    result = search(shape, cluster, gpus=16384, global_batch_tokens=16 * 2**20)
    result.plans[0].layout, result.plans[0].reasons, result.evaluated

Degrees: tp divides heads, kv_heads and ffn (at most 64); cp is a power of two up to 32 that
divides the sequence with tp; pp divides what is left of the GPUs and is at most the layer
count; dp takes the rest. Sharded optimizers / FSDP shard over all of dp or, hybrid-sharded
(HSDP), over groups of 8 or 64 data-parallel ranks replicated across the rest. An MoE model
adds ep, a power of two dividing its experts (at most 256) and tp x cp x the shard group
(folded, layout.py), and the "norm_act" recomputation (norms and the experts' SwiGLU,
Megatron-Core's MoE default; dense models are not offered it). Pinning any
field (`fixed={"tp": 8}`) restricts the search to it.

Plans are ranked by the lower end of their predicted throughput: less the family's held-out
error (planner.evidence.uncertainty_pts) and less planner.evidence's discount for a layout
family larger than any published run of it (the model's errors are what a search would
otherwise maximise), among the layouts the trainer can run (fm_pipeline.planner.runnable); the
ones the cost model rates faster but the trainer cannot run (cp, DeepSpeed's ZeRO-2,
recomputing half the layers, ...) come back apart, in `not_runnable`, each with its reasons. `runnable_only=False`
ranks the whole space, for questions about layouts this trainer does not have.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.errors import PlanInputError, require_positive
from fm_pipeline.planner.evidence import (
    high_mfu_flag,
    lower_bound_factor,
    ranking_discount,
    uncertainty_pts,
)
from fm_pipeline.planner.layout import (
    RECOMPUTE,
    SCHEDULES,
    SHARDING,
    Candidates,
    Layout,
    valid_mask,
)
from fm_pipeline.planner.precision import check_supported, get_precision
from fm_pipeline.planner.runnable import not_runnable, runnable_mask
from fm_pipeline.planner.shape import ModelShape
from fm_pipeline.planner.step import Evaluation, evaluate

MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 4, 8)
MAX_TP = 64
MAX_CP = 32
HSDP_SHARD_GROUPS = (8, 64)  # besides sharding over all of dp: shard in 8 or 64, replicate across
MAX_EP = 256
SEARCH_FIELDS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages", "recompute",
                 "sharding", "dp_shard")


@dataclass
class RankedPlan:
    rank: int
    layout: Layout
    index: int  # into the evaluated candidates
    reasons: list[str] = field(default_factory=list)


@dataclass
class SearchResult:
    plans: list[RankedPlan]
    candidates: Candidates
    evaluation: Evaluation
    evaluated: int
    fitting: int
    seconds: float
    gpus: int
    # Faster in the cost model than plans[0] but not runnable by the trainer; reasons say why.
    not_runnable: list[RankedPlan] = field(default_factory=list)
    runnable_only: bool = True
    precision: str = "bf16"
    # Each candidate's MFU uncertainty in points (planner.evidence.uncertainty_pts).
    uncertainty_pts: np.ndarray | None = None

    def metrics(self, index: int) -> dict:
        from fm_pipeline.planner.prediction import plan_metrics

        metrics = plan_metrics(self.evaluation, index)
        if self.uncertainty_pts is not None:
            metrics["mfu_uncertainty_pts"] = float(self.uncertainty_pts[index])
        return metrics


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _ep_degrees(shape: ModelShape) -> list[int]:
    if not shape.experts:
        return [1]
    return [2**i for i in range(int(math.log2(MAX_EP)) + 1) if shape.experts % 2**i == 0]


def _product(axes: list) -> np.ndarray:
    """The cartesian product of `axes` as rows (itertools.product's order), built in numpy:
    a Python list of 100k tuples would cost more than evaluating them."""
    values = [np.asarray(a, dtype=np.int64) for a in axes]
    index = np.indices([len(v) for v in values]).reshape(len(values), -1)
    return np.stack([v[i] for v, i in zip(values, index, strict=True)], axis=1)


def enumerate_candidates(shape: ModelShape, *, gpus: int, global_batch_tokens: int,
                         fixed: dict | None = None) -> Candidates:
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(SEARCH_FIELDS)
    if unknown:
        raise PlanInputError(
            sorted(unknown)[0], f"cannot be pinned; pin one of {', '.join(SEARCH_FIELDS)}"
        )

    def options(name, default):
        return [fixed[name]] if name in fixed else list(default)

    common = math.gcd(shape.heads, shape.kv_heads, shape.ffn, gpus)
    tps = options("tp", [d for d in _divisors(common) if d <= MAX_TP])
    cps = options("cp", [2**i for i in range(int(math.log2(MAX_CP)) + 1)])
    triples = []
    for tp, cp in itertools.product(tps, cps):
        if gpus % (tp * cp):
            continue
        for pp in options("pp", _divisors(gpus // (tp * cp))):
            if pp <= shape.layers and gpus % (tp * cp * pp) == 0:
                dp = gpus // (tp * cp * pp)
                if "dp" not in fixed or fixed["dp"] == dp:
                    triples.append((tp, cp, pp, dp))
    if not triples:
        raise PlanInputError(
            "gpus",
            f"no tp x cp x pp x dp factorization of {gpus} GPUs matches the pinned degrees {fixed}",
        )
    flash = shape.flash_attention
    recompute = [
        RECOMPUTE.index(r)
        for r in options("recompute", RECOMPUTE)
        if "recompute" in fixed or not (
            (flash and r == "selective") or (not shape.experts and r == "norm_act"))
    ]
    sharding = [SHARDING.index(s) for s in options("sharding", SHARDING)]
    # dp_shard pinned: that shard group (0: all of dp).
    shard_groups = options("dp_shard", (
        [0] if "sharding" in fixed and fixed["sharding"] == "ddp" else [0, *HSDP_SHARD_GROUPS]
    ))
    axes = [
        np.arange(len(triples)),
        options("micro_batch", MICRO_BATCHES),
        options("virtual_stages", VIRTUAL_STAGES),
        recompute,
        sharding,
        shard_groups,
        options("ep", _ep_degrees(shape)),
    ]
    grid = _product(axes)
    t = np.array(triples, dtype=np.int64)[grid[:, 0]]
    dp, v, s, group = t[:, 3], grid[:, 2], grid[:, 4], grid[:, 5]
    ddp = s == SHARDING.index("ddp")
    keep = (group == 0) | (~ddp & (group < dp) & (dp % np.maximum(group, 1) == 0))
    c = Candidates(
        tp=t[:, 0],
        cp=t[:, 1],
        pp=t[:, 2],
        dp=dp,
        micro_batch=grid[:, 1],
        virtual_stages=v,
        recompute=grid[:, 3],
        sharding=s,
        dp_shard=np.where(ddp, 1, np.where(group == 0, dp, group)),
        schedule=np.where(v > 1, SCHEDULES.index("Interleaved1F1B"), SCHEDULES.index("1F1B")),
        ep=grid[:, 6],
    ).take(keep)
    return c.take(valid_mask(shape, c, global_batch_tokens=global_batch_tokens))


def search(
    shape: ModelShape,
    cluster: ClusterConfig,
    *,
    gpus: int,
    global_batch_tokens: int,
    top: int = 5,
    fixed: dict | None = None,
    precision: str = "bf16",
    dp_overlap: bool = True,
    ep_overlap: bool | str = "none",
    sequence_parallel: bool = True,
    tp_overlap: bool = True,
    runnable_only: bool = True,
    not_runnable_top: int = 3,
) -> SearchResult:
    require_positive("gpus", gpus, integer=True)
    require_positive("global_batch_tokens", global_batch_tokens, integer=True)
    if global_batch_tokens % shape.seq_len:
        raise PlanInputError(
            "global_batch_tokens",
            f"{global_batch_tokens} is not a whole number of sequences of {shape.seq_len} tokens",
        )
    prec = get_precision(precision)
    check_supported(prec, cluster.accelerator)
    precision = prec.name
    start = time.perf_counter()
    c = enumerate_candidates(shape, gpus=gpus, global_batch_tokens=global_batch_tokens, fixed=fixed)
    ev = evaluate(
        shape,
        cluster,
        c,
        global_batch_tokens=global_batch_tokens,
        precision=precision,
        dp_overlap=dp_overlap,
        ep_overlap=ep_overlap,
        sequence_parallel=sequence_parallel,
        tp_overlap=tp_overlap,
    )
    space = (runnable_mask(shape, c, precision=precision, ep_overlap=ep_overlap) if runnable_only
             else np.ones(len(c), dtype=bool))
    discount = ranking_discount(c, gpus_per_node=cluster.gpus_per_node)
    uncertainty = uncertainty_pts(c, gpus_per_node=cluster.gpus_per_node)
    # Ranked by the lower end of each plan's band: the model's errors are not what wins.
    score = ev.tokens_per_s * (1 - discount) * lower_bound_factor(ev.mfu, uncertainty)
    fits = np.flatnonzero(ev.fits & space)
    order = _ranked(ev, fits, score)[:top]
    from fm_pipeline.planner.explain import reasons_for

    plans = [
        RankedPlan(
            rank=r + 1,
            layout=c.layout(int(i)),
            index=int(i),
            reasons=reasons_for(shape, cluster, c, ev, int(i), space=space, discount=discount)
            + [f"ranked at its MFU's lower end: {float(ev.mfu[i]):.1%} less "
               f"{float(uncertainty[i]):.1f} points, its layout family's held-out error"]
            + [flag for flag in [high_mfu_flag(float(ev.mfu[i]), dense=not shape.experts,
                                               precision=precision)] if flag],
        )
        for r, i in enumerate(order)
    ]
    outside = np.flatnonzero(ev.fits & ~space)
    if len(order):
        outside = outside[score[outside] > score[order[0]]]
    elsewhere = [
        RankedPlan(rank=r + 1, layout=c.layout(i), index=i,
                   reasons=not_runnable(shape, c.layout(i), precision=precision,
                                        ep_overlap=ep_overlap))
        for r, i in enumerate(_distinct_degrees(c, _ranked(ev, outside, score),
                                                not_runnable_top))
    ]
    return SearchResult(
        uncertainty_pts=uncertainty,
        plans=plans,
        candidates=c,
        evaluation=ev,
        evaluated=len(c),
        fitting=len(fits),
        seconds=time.perf_counter() - start,
        gpus=gpus,
        not_runnable=elsewhere,
        runnable_only=runnable_only,
        precision=precision,
    )


def _distinct_degrees(c: Candidates, ranked: np.ndarray, n: int) -> list[int]:
    """The first n of `ranked` with distinct degrees (one sharding variant of each)."""
    seen, out = set(), []
    for i in ranked[: 50 * n]:
        key = (c.tp[i], c.pp[i], c.dp[i], c.cp[i], c.ep[i], c.micro_batch[i],
               c.virtual_stages[i], c.recompute[i])
        if key not in seen:
            seen.add(key)
            out.append(int(i))
            if len(out) == n:
                break
    return out


def _ranked(ev: Evaluation, index: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Fastest first as ranked (throughput less the evidence discount); among equals the
    one using less memory."""
    return index[np.lexsort((ev.memory.total_gib[index], -score[index]))]
