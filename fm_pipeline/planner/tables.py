"""Rich tables of plans for people (the `fm plan` commands print these unless --json)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from fm_pipeline.planner.estimate import Estimate
from fm_pipeline.planner.precision import get_precision
from fm_pipeline.planner.search import SearchResult
from fm_pipeline.planner.whatif import WhatIf


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _money(x: float) -> str:
    return f"${x / 1e6:,.2f}M" if x >= 1e6 else f"${x:,.0f}"


def estimate_view(est: Estimate) -> Group:
    d = est.to_dict()
    head = Table(title=f"{est.shape.describe()}\n{est.layout.describe()} on {est.layout.gpus} x "
                       f"{est.cluster.accelerator.name} in {est.precision}", show_header=False)
    head.add_column(style="bold")
    head.add_column(justify="right")
    fits = "[green]yes[/]" if d["fits"] else "[red]NO[/]"
    for label, value in [
        ("step time", f"{d['step_time_s']:.3f} s"), ("tokens/s", f"{d['tokens_per_s']:,.0f}"),
        ("MFU / HFU", f"{_pct(d['mfu'])} / {_pct(d['hfu'])} of the "
                      f"{get_precision(d['precision']).compute_dtype} peak"),
        ("MFU uncertainty", f"+-{d['mfu_uncertainty_pts']:.1f} points (the layout family's "
                            "held-out error)"),
        ("memory per GPU", f"{d['memory_gib_per_gpu']:.1f} of {d['memory_capacity_gib']:.0f} GiB"),
        ("fits", fits), ("micro-batches per step", str(d["microbatches"])),
        ("compute / exposed comm / bubble", f"{_pct(d['compute_fraction'])} / "
         f"{_pct(d['exposed_comm_fraction'])} / {_pct(d['bubble_fraction'])}"),
    ]:
        head.add_row(label, value)

    time_t = Table(title="where a step goes (s)")
    mem_t = Table(title="memory per GPU (GiB, before margin)")
    for t in (time_t, mem_t):
        t.add_column("part")
        t.add_column("value", justify="right")
    for k, v in d["time_s"].items():
        time_t.add_row(k, f"{v:.3f}")
    for k, v in d["memory_gib"].items():
        mem_t.add_row(k, f"{v:.2f}" if k != "fragmentation_margin" else _pct(v))

    rel, cost = d["reliability"], d["cost"]
    run_t = Table(title="reliability and cost", show_header=False)
    run_t.add_column(style="bold")
    run_t.add_column(justify="right")
    for label, value in [
        (
            "checkpoint",
            f"{rel['checkpoint_gb']:,.0f} GB, write {_duration(rel['checkpoint_write_s'])}, "
            f"blocks {_duration(rel['checkpoint_blocking_s'])}",
        ),
        ("job MTBF", _duration(None if rel["job_mtbf_h"] is None else rel["job_mtbf_h"] * 3600)),
        (
            "checkpoint every",
            f"{_duration(rel['interval_s'])} ({rel['interval_steps']} steps, Young/Daly)",
        ),
        ("goodput", _pct(rel["goodput"])),
        *([(
            "with the fast tier",
            f"snapshot every {_duration(d['fast_tier']['fast_interval_s'])} "
            f"({d['fast_tier']['fast_interval_steps']} steps, memory_every_steps), durable "
            f"every {d['fast_tier']['durable_interval_steps']} steps: goodput "
            f"{_pct(d['fast_tier']['goodput'])}",
        )] if d.get("fast_tier") else []),
        (
            "time to train",
            f"{_duration(cost['time_to_train_days'] * 86400)} for "
            f"{cost['training_tokens']:.3g} tokens ({cost['steps']:,} steps)",
        ),
        ("GPU-hours", f"{cost['gpu_hours']:,.0f}"),
        (
            "cost",
            f"{_money(cost['dollars'])} "
            f"({_money(cost['checkpoint_storage_dollars'])} checkpoints), "
            f"${cost['dollars_per_million_tokens']:.3f} per million tokens",
        ),
    ]:
        run_t.add_row(label, value)

    place = Table(title="rank placement (tp innermost, then cp, pp, dp)")
    for col in ("group", "size", "span (GPUs)", "reaches"):
        place.add_column(col)
    for g in d["placement"]["groups"]:
        place.add_row(g["name"], str(g["size"]), str(g["span_gpus"]), g["reaches"])
    parts = [head, time_t, mem_t, run_t, place]
    if est.warnings:
        parts.append("\n".join(f"[yellow]warning:[/] {w}" for w in est.warnings))
    return Group(*parts)


def search_view(result: SearchResult) -> Group:
    t = Table(
        title=f"best of {result.fitting} fitting layouts ({result.evaluated} evaluated on "
        f"{result.gpus} GPUs in {result.seconds:.2f} s, {result.precision})"
    )
    for col in ("#", "layout", "step s", "tokens/s", "MFU +- held-out", "GiB/GPU", "bubble",
                "exposed comm"):
        t.add_column(col, justify="right" if col not in ("layout",) else "left")
    for p in result.plans:
        m = result.metrics(p.index)
        t.add_row(
            str(p.rank),
            p.layout.describe(),
            f"{m['step_time_s']:.3f}",
            f"{m['tokens_per_s']:,.0f}",
            f"{_pct(m['mfu'])} +-{m['mfu_uncertainty_pts']:.1f}",
            f"{m['memory_gib_per_gpu']:.1f}",
            _pct(m["bubble_fraction"]),
            _pct(m["exposed_comm_fraction"]),
        )
    apart = []
    if result.not_runnable:
        other = Table(title="faster in the cost model, not runnable by this trainer")
        for col in ("layout", "tokens/s", "MFU", "why not"):
            other.add_column(col)
        for p in result.not_runnable:
            m = result.metrics(p.index)
            other.add_row(p.layout.describe(), f"{m['tokens_per_s']:,.0f}", _pct(m["mfu"]),
                          "; ".join(p.reasons))
        apart.append(other)
    if not result.plans:
        what = "runnable layout" if result.runnable_only else "layout"
        return Group(t, f"[red]no {what} fits in memory[/]", *apart)
    why = "\n".join(f"  - {r}" for r in result.plans[0].reasons)
    return Group(t, f"[bold]why #1:[/]\n{why}", *apart)


def whatif_view(wi: WhatIf) -> Group:
    t = Table(title="what if")
    for col in (
        "scenario",
        "GPUs",
        "layout",
        "step s",
        "MFU",
        "bubble",
        "exposed comm",
        "goodput",
        "days",
        "cost",
        "note",
    ):
        t.add_column(col)
    for r in wi.rows():
        if r["layout"] is None:
            t.add_row(
                r["scenario"],
                str(r["gpus"]),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                f"[red]{r['note']}[/]",
            )
            continue
        t.add_row(
            r["scenario"],
            str(r["gpus"]),
            r["layout"],
            f"{r['step_time_s']:.2f}",
            _pct(r["mfu"]),
            _pct(r["bubble_fraction"]),
            _pct(r["exposed_comm_fraction"]),
            _pct(r["goodput"]),
            f"{r['time_to_train_days']:.1f}",
            _money(r["dollars"]),
            r["note"],
        )
    return Group(t, f"[bold]what breaks first:[/] {wi.breaks_first}")
