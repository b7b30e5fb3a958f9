"""What-if: the same training on 2x, 4x ... the GPUs (same global batch), with half or double
the fabric and storage bandwidth, on the other fabric cabling (rail-optimised or top-of-rack),
with half or double the failure rate; and which term of the time grows fastest, "what
breaks first".

    wi = what_if(shape, cluster, gpus=16384, global_batch_tokens=16 * 2**20)
    wi.breaks_first, [s.name for s in wi.scenarios]

Each doubling appears twice: the same layout with dp doubled (what happens to the running
job if you just add GPUs: fewer micro-batches per pipeline, the same gradient traffic per
step behind half the compute, twice the failures), and re-planned by the search (what the
planner would do instead). "What breaks first" compares the first against the baseline:
the term whose share of the time grows the most (pipeline bubble, exposed tensor /
context / pipeline / data-parallel communication as shares of the step; checkpoint pauses
and failure losses as shares of wall-clock time; the data loader's reads as the share of
the store's read bandwidth they take, planner/data_reads.py). A doubling with no valid layout (the
global batch cannot feed that many GPUs) is reported as such: often the first thing to break.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.estimate import Estimate, estimate
from fm_pipeline.planner.layout import Layout, check_layout
from fm_pipeline.planner.runnable import not_runnable
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import ModelShape

MIN_SHARE = 0.02  # a term must reach 2% of the time to count as breaking


@dataclass
class Scenario:
    name: str
    gpus: int
    estimate: Estimate | None
    note: str = ""

    def terms(self) -> dict[str, float]:
        if self.estimate is None:
            return {}
        t = self.estimate.metrics["time_s"]
        step = self.estimate.metrics["step_time_s"]
        rel = self.estimate.reliability
        return {
            "pipeline bubble": t["bubble"] / step,
            "tensor-parallel comm": t["tp_comm"] / step,
            "context-parallel comm": t["cp_comm"] / step,
            "pipeline comm": t["pp_comm"] / step,
            "data-parallel comm": t["dp_comm"] / step,
            "expert-parallel all-to-all": t["ep_comm"] / step,
            "checkpoint pauses": rel.checkpoint_overhead,
            "failures and restarts": rel.failure_overhead,
            # The store's read bandwidth the loader takes; past 1 it stalls every step.
            "data reads": self.estimate.data.share if self.estimate.data else 0.0,
        }

    def row(self) -> dict:
        e = self.estimate
        if e is None:
            return {"scenario": self.name, "gpus": self.gpus, "layout": None, "note": self.note}
        m = e.metrics
        return {
            "scenario": self.name,
            "gpus": self.gpus,
            "layout": e.layout.describe(),
            "step_time_s": m["step_time_s"],
            "mfu": m["mfu"],
            "tokens_per_s": m["tokens_per_s"],
            "bubble_fraction": m["bubble_fraction"],
            "exposed_comm_fraction": m["exposed_comm_fraction"],
            "goodput": e.reliability.goodput,
            "data_read_share": e.data.share if e.data else None,
            "effective_mfu": m["mfu"] * e.reliability.goodput,
            "checkpoint_interval_s": e.reliability.interval_s,
            "time_to_train_days": e.cost.time_to_train_days,
            "dollars": e.cost.dollars,
            "crosses_regions": e.placement.crosses_regions,
            "note": self.note,
        }


@dataclass
class WhatIf:
    scenarios: list[Scenario]
    breaks_first: str
    growth: dict[str, float] = field(default_factory=dict)  # term -> share at 2x / at 1x

    def rows(self) -> list[dict]:
        return [s.row() for s in self.scenarios]

    def to_dict(self) -> dict:
        return {"scenarios": self.rows(), "breaks_first": self.breaks_first, "growth": self.growth}

    def markdown(self) -> str:
        lines = [
            "| scenario | GPUs | layout | step s | MFU | bubble | exposed comm | goodput | "
            "days | $M | note |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in self.rows():
            if r["layout"] is None:
                lines.append(f"| {r['scenario']} | {r['gpus']} | - | | | | | | | | {r['note']} |")
                continue
            lines.append(
                f"| {r['scenario']} | {r['gpus']} | {r['layout']} | {r['step_time_s']:.2f} | "
                f"{r['mfu']:.1%} | {r['bubble_fraction']:.1%} | {r['exposed_comm_fraction']:.1%} | "
                f"{r['goodput']:.1%} | {r['time_to_train_days']:.1f} | {r['dollars'] / 1e6:.1f} | "
                f"{r['note']} |"
            )
        return "\n".join(lines) + f"\n\nWhat breaks first: {self.breaks_first}"


def _best(shape, cluster, gpus, batch, precision, runnable_only: bool = True,
          knobs: dict | None = None) -> tuple[Layout | None, str]:
    result = search(
        shape, cluster, gpus=gpus, global_batch_tokens=batch, top=1, precision=precision,
        runnable_only=runnable_only, **(knobs or {}),
    )
    if result.plans:
        beyond = "" if runnable_only else "; searched beyond the trainer, as the given layout is"
        return result.plans[
            0
        ].layout, f"re-planned ({result.fitting} of {result.evaluated} layouts fit{beyond})"
    if result.not_runnable:  # the cost model's answer, said to be beyond this trainer
        best = result.not_runnable[0]
        return best.layout, ("re-planned, not runnable by this trainer: "
                             + "; ".join(best.reasons))
    sequences = batch // shape.seq_len
    return None, (
        f"no layout fits: {result.evaluated} valid layouts, none fits in memory"
        if result.evaluated
        else f"the global batch of {sequences} sequences cannot feed {gpus} GPUs"
    )


def breaks_first(base: Scenario, bigger: Scenario) -> tuple[str, dict[str, float]]:
    """The term whose share of the time grows the most (in points); growth maps each term to
    its added share."""
    if bigger.estimate is None:
        return f"at {bigger.gpus} GPUs: {bigger.note}", {}
    before, after = base.terms(), bigger.terms()
    growth = {k: after[k] - before[k] for k in after}
    term = max(growth, key=growth.get)
    if after[term] < MIN_SHARE or growth[term] <= 0:
        return (
            f"nothing yet: at {bigger.gpus} GPUs no overhead grows past {MIN_SHARE:.0%} "
            "of the time",
            growth,
        )
    of = "of the store's read bandwidth" if term == "data reads" else "of the time"
    return (
        f"{term}: {before[term]:.1%} -> {after[term]:.1%} {of} at {bigger.gpus} GPUs "
        f"(MFU {base.estimate.metrics['mfu']:.1%} -> {bigger.estimate.metrics['mfu']:.1%}, "
        f"goodput {base.estimate.reliability.goodput:.1%} -> "
        f"{bigger.estimate.reliability.goodput:.1%})"
    ), growth


def _scaled(shape, layout: Layout, factor: int, batch: int) -> tuple[Layout | None, str]:
    """The running job's layout with dp multiplied; None with the reason when it cannot run."""
    bigger = replace(layout, dp=layout.dp * factor)
    try:
        check_layout(shape, bigger, gpus=bigger.gpus, global_batch_tokens=batch)
    except PlanInputError as e:
        return None, f"dp x{factor} breaks the layout: {e.detail}"
    return bigger, f"same layout, dp x{factor}"


def what_if(
    shape: ModelShape,
    cluster: ClusterConfig,
    *,
    gpus: int,
    global_batch_tokens: int,
    training_tokens: float | None = None,
    layout: Layout | None = None,
    doublings: int = 2,
    precision: str = "bf16",
    **knobs,
) -> WhatIf:
    """`knobs`: the cost model's settings (sequence_parallel, tp_overlap, dp_overlap,
    ep_overlap), the same in every scenario."""
    def run(name, c: ClusterConfig, n: int, lay: Layout | None, note: str = "") -> Scenario:
        if lay is None:
            return Scenario(name=name, gpus=n, estimate=None, note=note)
        est = estimate(
            shape,
            c,
            lay,
            global_batch_tokens=global_batch_tokens,
            training_tokens=training_tokens,
            precision=precision,
            **knobs,
        )
        notes = [note] if note else []
        if est.placement.crosses_regions:
            notes.append(f"{'/'.join(est.placement.crosses_regions)} crosses regions")
        return Scenario(name=name, gpus=n, estimate=est, note="; ".join(notes))

    note = "given layout"
    if layout is None:
        layout, note = _best(shape, cluster, gpus, global_batch_tokens, precision,
                             knobs=knobs)
        if layout is None:
            base = Scenario("baseline", gpus, None, note)
            return WhatIf(scenarios=[base], breaks_first=f"already at {gpus} GPUs: {note}")
    base = run("baseline", cluster, gpus, layout, note)
    scenarios = [base]
    scaled = []
    for k in range(1, doublings + 1):
        n = gpus * 2**k
        lay, why = _scaled(shape, layout, 2**k, global_batch_tokens)
        scaled.append(run(f"{2**k}x GPUs, dp x{2**k}", cluster, n, lay, why))
        # Re-planned in the space the given layout lives in: one the trainer cannot run
        # (Llama 3's uneven pipeline, say) is compared with the cost model's best.
        lay, why = _best(shape, cluster, n, global_batch_tokens, precision,
                         runnable_only=not not_runnable(shape, layout, precision=precision),
                         knobs=knobs)
        scenarios += [scaled[-1], run(f"{2**k}x GPUs, re-planned", cluster, n, lay, why)]
    first, growth = breaks_first(base, scaled[0]) if doublings else ("", {})
    for factor in (0.5, 2.0):
        scenarios.append(
            run(
                f"fabric x{factor:g}",
                cluster.with_changes(inter_node_gbps=cluster.inter_node_gbps * factor),
                gpus,
                layout,
            )
        )
    # The same GPUs cabled the other way (planner.cluster: how far one switch hop reaches).
    other = "tor" if cluster.fabric == "rail" else "rail"
    scenarios.append(run(f"{other} fabric", cluster.with_changes(fabric=other), gpus, layout))
    for factor in (0.5, 2.0):
        scenarios.append(
            run(
                f"storage x{factor:g}",
                cluster.with_changes(
                    storage_write_gbps=cluster.storage_write_gbps * factor,
                    storage_read_gbps=cluster.restore_gbps * factor,
                ),
                gpus,
                layout,
            )
        )
    for factor in (2.0, 0.5):
        scenarios.append(
            run(
                f"failures x{factor:g}",
                cluster.with_changes(failure_rate_scale=cluster.failure_rate_scale * factor),
                gpus,
                layout,
            )
        )
    return WhatIf(scenarios=scenarios, breaks_first=first, growth=growth)
