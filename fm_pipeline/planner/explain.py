"""Why the search chose a plan, in sentences a person can check: for each knob, what the best
plan with a smaller (or different) setting would cost, or that none of those fits."""

from __future__ import annotations

import numpy as np

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.collectives import LEVEL_NAMES, NODE
from fm_pipeline.planner.evidence import evidence_note
from fm_pipeline.planner.layout import RECOMPUTE, SHARDING, Candidates
from fm_pipeline.planner.shape import ModelShape
from fm_pipeline.planner.step import Evaluation


def _versus(ev: Evaluation, i: int, mask: np.ndarray, discount: np.ndarray) -> str | None:
    """'x% faster than the best alternative', or None when no alternative fits. The best
    alternative is the best as ranked (less the evidence discount, planner.evidence); the
    gain is as predicted, with the discount named where it decided."""
    alt = np.flatnonzero(mask & ev.fits)
    if not len(alt):
        return None
    best = alt[np.argmax(ev.tokens_per_s[alt] * (1 - discount[alt]))]
    gain = ev.tokens_per_s[i] / ev.tokens_per_s[best] - 1
    unevidenced = discount[best] > discount[i]
    if gain < -0.005 and unevidenced:
        return (f"{-gain:.0%} slower than the best alternative as predicted, ranked above "
                "it: no published run of its family at this scale")
    said = "as fast as the alternatives" if gain < 0.005 else (
        f"{gain:.0%} faster than the best alternative")
    return said + (", whose family has no published run at this scale" if unevidenced else "")


def reasons_for(
    shape: ModelShape, cluster: ClusterConfig, c: Candidates, ev: Evaluation, i: int,
    space: np.ndarray | None = None, discount: np.ndarray | None = None,
) -> list[str]:
    """`space`: the candidates the plan was chosen among (the runnable ones); alternatives
    outside it are not compared. `discount`: the evidence discount each was ranked with."""
    within = np.ones(len(c), dtype=bool) if space is None else space
    discount = np.zeros(len(c)) if discount is None else discount

    def versus(mask: np.ndarray) -> str | None:
        return _versus(ev, i, mask & within, discount)

    tp, pp, cp = int(c.tp[i]), int(c.pp[i]), int(c.cp[i])
    v, mb = int(c.virtual_stages[i]), int(c.micro_batch[i])
    cap = ev.memory.capacity_gib
    out = []

    if tp == 1:
        out.append("tp=1: the layers fit without splitting matrices across GPUs")
    else:
        where = (
            "keeps TP inside NVLink"
            if int(ev.tp_level[i]) == NODE
            else f"TP spans the {LEVEL_NAMES[int(ev.tp_level[i])]} fabric"
        )
        smaller = versus(c.tp < tp)
        out.append(
            f"tp={tp} {where}; "
            + (
                smaller.replace("alternative", "plan with smaller tp")
                if smaller
                else "nothing with smaller tp fits"
            )
        )
    if pp == 1:
        out.append("pp=1: no pipeline bubble")
    else:
        smaller = versus(c.pp < pp)
        why = (
            f"pp={pp} because weights and activations do not fit in {cap:.0f} GiB below it"
            if smaller is None
            else f"pp={pp}: {smaller.replace('alternative', 'plan with smaller pp')}"
        )
        out.append(why + f" (bubble {ev.bubble_s[i] / ev.step_time_s[i]:.0%} of the step)")
    if cp > 1:
        smaller = versus(c.cp < cp)
        out.append(
            f"cp={cp} splits each {shape.seq_len}-token sequence over {cp} GPUs; "
            + (
                smaller.replace("alternative", "plan with smaller cp")
                if smaller
                else "nothing with smaller cp fits"
            )
        )
    if v > 1:
        plain = versus((c.virtual_stages == 1) & (c.pp == pp) & (c.tp == tp))
        out.append(
            f"{v} virtual stages per rank shrink the bubble to (p-1)/(v m)"
            + (f"; {plain.replace('alternative', 'non-interleaved plan')}" if plain else "")
        )
    if shape.experts:
        out.append(_ep_reason(shape, c, ev, i, versus))
    recompute = RECOMPUTE[int(c.recompute[i])]
    if recompute == "none":
        out.append("no activation recomputation: activations fit")
    else:
        lighter = versus(c.recompute < c.recompute[i])
        out.append(
            f"{recompute} recomputation because "
            + (
                "nothing lighter fits"
                if lighter is None
                else lighter.replace("alternative", "plan that recomputes less")
            )
        )
    sharding = SHARDING[int(c.sharding[i])]
    shard = int(c.dp_shard[i] * c.cp[i])
    if sharding == "ddp":
        out.append("plain data parallelism: optimizer state fits unsharded")
    else:
        out.append(
            f"{sharding} over {shard} ranks; "
            + (
                versus(c.sharding != c.sharding[i]) or "the only sharding that fits"
            ).replace("alternative", "other sharding")
        )
    m = int(ev.microbatches[i])
    out.append(f"dp={int(c.dp[i])} with {m} micro-batch{'es' if m != 1 else ''} of {mb} per step")
    out.append(evidence_note(c, i, gpus_per_node=cluster.gpus_per_node))
    return out


def _ep_reason(shape: ModelShape, c: Candidates, ev: Evaluation, i: int, versus) -> str:
    """Expert parallelism trades expert memory and FSDP traffic (fewer experts per GPU to
    gather) against the all-to-all (wider, and across nodes past one node's GPUs)."""
    ep = int(c.ep[i])
    local = shape.experts // ep
    where = LEVEL_NAMES[int(ev.ep_level[i])]
    a2a = ev.ep_comm_s[i] / ev.step_time_s[i]
    head = (f"ep={ep}{_fold(c, i)}: {local} of {shape.experts} experts per GPU, the "
            f"all-to-all inside the {where} ({a2a:.0%} of the step)") if ep > 1 else (
            f"ep=1: every GPU holds all {shape.experts} experts (sharded by FSDP), no all-to-all")
    smaller, larger = versus(c.ep < ep), versus(c.ep > ep)
    parts = [head]
    if smaller:
        parts.append(smaller.replace("alternative", "plan with smaller ep"))
    elif ep > 1:
        parts.append("nothing with smaller ep fits")
    if larger:
        parts.append(larger.replace("alternative", "plan with larger ep"))
    return "; ".join(parts)


def _fold(c: Candidates, i: int) -> str:
    """" folded over tp 2 x dp 16" where the ep group takes in tensor- or context-parallel
    ranks (ep consecutive ranks of a stage, tp innermost); "" when it is data-parallel only."""
    left, parts = int(c.ep[i]), []
    for name, degree in (("tp", int(c.tp[i])), ("cp", int(c.cp[i])), ("dp", int(c.dp_shard[i]))):
        take = min(degree, left)
        if take > 1:
            parts.append(f"{name} {take}")
        left //= max(take, 1)
    if not parts or parts[0].startswith("dp"):
        return ""
    return " folded over " + " x ".join(parts)
