"""What the cost model has been checked against, by layout family, and how the search
treats a layout beyond that: a search maximises the model's errors (where the model is
optimistic for a family, the search picks it), so a family is trusted only as far as a
published run of it goes.

    from fm_pipeline.planner.evidence import evidence_gpus, ranking_discount
    evidence_gpus()["data parallel"]          # the largest published run of the family
    ranking_discount(c, gpus_per_node=8)      # 0, or UNCERTAINTY beyond the evidence

Families, by degrees (the sharding within a family does not change it): a pipeline
(pp > 1), context parallel (cp > 1), expert parallel (ep > 1), tensor parallel across nodes
(tp > GPUs a node), tensor parallel in a node, and data parallel alone (FSDP, HSDP, DDP,
ZeRO). The evidence of a family is the largest GPU count among the calibration's benchmark
rows whose published degrees put them in it (fm_pipeline.planner.literature; production
totals and memory-only rows excluded). Beyond it, the search ranks a layout as if its
throughput were UNCERTAINTY lower: the widest error the calibration shows on validation
rows of kernels it models (NAR21's +20%; rowwise FP8's +29% is a known kernel gap, not a
family's), so an unevidenced family wins only by more than the model's demonstrated error.
The predictions themselves are not changed; plans say what was discounted and why.

Within the evidence, a plan's MFU carries the held-out error of its family
(`uncertainty_pts`): the median absolute error, in MFU points, of the family's published
benchmark rows predicted through `fm plan estimate` with the constants fitted on other
sources (benchmarks.planner_fidelity, shipped as held_out.json beside this module; a family
without rows takes the median over all rows). The search ranks by the lower end of that
band, so a family the model over-predicts does not win on its error. A dense BF16 MFU
above 55% is flagged with the highest a published dense BF16 run reached.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files

import numpy as np

from fm_pipeline.planner.layout import Candidates

UNCERTAINTY = 0.20
FAMILIES = ("pipeline", "context parallel", "expert parallel", "tensor parallel across nodes",
            "tensor parallel in a node", "data parallel")


def family_index(tp, pp, cp, ep, *, gpus_per_node: int) -> np.ndarray:
    """The first family that describes each layout (vectorized)."""
    tp, pp, cp, ep = (np.asarray(x) for x in (tp, pp, cp, ep))
    return np.select(
        [pp > 1, cp > 1, ep > 1, tp > gpus_per_node, tp > 1],
        [0, 1, 2, 3, 4], default=5)


def published_family(run, gpus_per_node: int = 8) -> str | None:
    """The family of a published run's layout (literature.PublishedRun); None when the
    source does not publish its layout."""
    if not (run.tp and run.pp):
        return None
    return FAMILIES[int(family_index(run.tp, run.pp, run.cp, run.pinned.get("ep", 1),
                                     gpus_per_node=gpus_per_node))]


@cache
def evidence_gpus(gpus_per_node: int = 8) -> dict[str, int]:
    """Largest published benchmark run of each family (0: none)."""
    from fm_pipeline.planner.literature import PUBLISHED_RUNS

    best = dict.fromkeys(FAMILIES, 0)
    for run in PUBLISHED_RUNS:
        family = published_family(run, gpus_per_node)
        if run.production or run.metric == "memory_gib" or family is None:
            continue
        best[family] = max(best[family], run.gpus)
    return best


def evidence_of(c: Candidates, *, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """(family index, the family's evidence in GPUs) of each candidate."""
    family = family_index(c.tp, c.pp, c.cp, c.ep, gpus_per_node=gpus_per_node)
    scale = np.array([evidence_gpus(gpus_per_node)[f] for f in FAMILIES])
    return family, scale[family]


def ranking_discount(c: Candidates, *, gpus_per_node: int) -> np.ndarray:
    """UNCERTAINTY for layouts larger than their family's evidence, else 0."""
    _, scale = evidence_of(c, gpus_per_node=gpus_per_node)
    gpus = c.tp * c.pp * c.dp * c.cp
    return np.where(gpus > scale, UNCERTAINTY, 0.0)


def evidence_note(c: Candidates, i: int, *, gpus_per_node: int) -> str:
    """One sentence on the evidence behind candidate i."""
    family, scale = evidence_of(c.take([i]), gpus_per_node=gpus_per_node)
    name, gpus = FAMILIES[int(family[0])], int(scale[0])
    size = int(c.tp[i] * c.pp[i] * c.dp[i] * c.cp[i])
    if size <= gpus:
        return f"evidence: {name} is calibrated on published runs up to {gpus:,} GPUs"
    seen = f"up to {gpus:,} GPUs" if gpus else "none"
    return (f"evidence: published runs of {name}: {seen}; at {size:,} GPUs it is ranked as "
            f"if {UNCERTAINTY:.0%} slower than predicted (the calibration's widest error)")


DENSE_BF16_FLAG = 0.55  # MFU past which a dense BF16 plan is flagged with the evidence


@cache
def held_out() -> dict:
    """benchmarks.planner_fidelity's held-out errors, as shipped (held_out.json)."""
    return json.loads(files("fm_pipeline.planner").joinpath("held_out.json").read_text())


def uncertainty_pts(c: Candidates, *, gpus_per_node: int) -> np.ndarray:
    """Each candidate's MFU uncertainty, in points: its layout family's held-out median
    absolute error (all rows' for a family without published rows)."""
    data = held_out()
    fallback = data["all"]["median_abs_err_pts"]
    per = [data["per_layout_family"].get(f, {}).get("median_abs_err_pts", fallback)
           for f in FAMILIES]
    family = family_index(c.tp, c.pp, c.cp, c.ep, gpus_per_node=gpus_per_node)
    return np.asarray(per, dtype=np.float64)[family]


LOWER_BOUND_FLOOR = 0.1  # below it the band says nothing of the order: keep throughput's


def lower_bound_factor(mfu: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """The share of a plan's predicted throughput its MFU's lower bound keeps; at least
    LOWER_BOUND_FLOOR, so plans whose band reaches zero (a tiny model's few percent) still
    rank by throughput among themselves instead of tying at nothing."""
    mfu = np.asarray(mfu, dtype=np.float64)
    return np.clip((mfu - pts / 100) / np.maximum(mfu, 1e-12), LOWER_BOUND_FLOOR, 1.0)


def high_mfu_flag(mfu: float, *, dense: bool, precision: str) -> str | None:
    """A sentence when a dense BF16 plan's MFU is past what published runs reached."""
    if not dense or precision != "bf16" or mfu <= DENSE_BF16_FLAG:
        return None
    best = held_out()["best_dense_bf16"]
    return (f"MFU {mfu:.0%} is above {DENSE_BF16_FLAG:.0%} for dense BF16: the highest a "
            f"published dense BF16 run reached is {best['mfu']:.0%} ({best['key']}); read it "
            "as the model's optimism until measured")
