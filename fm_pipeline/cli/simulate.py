"""`fm simulate`: what failures, checkpoints, stragglers and queues cost at cluster scale.

    fm simulate job                                   # Llama 3 405B: 54 days on 16,384 GPUs
    fm simulate job --gpus 4096 --days 30 --interval-min 20 --hot-spares 0 --plot out/
    fm simulate job --stragglers-per-node-day 0.002 --straggler-mitigation exclude --seeds 8
    fm simulate job --fast-tier --seeds 4             # in-memory snapshots + in-job restarts
    fm simulate sweep-interval --seeds 4 --plot out/  # ETTR vs checkpoint interval, Young/Daly
    fm simulate calibrate --plot docs/img/            # reproduce Llama 3's published numbers
    fm simulate tenants --jobs 400 --pool-gpus 4096 --plot out/   # fair-share trace replay
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from statistics import fmean, pstdev

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.sim.config import (
    CheckpointPolicy,
    FastTierPolicy,
    SimConfig,
    StragglerModel,
    llama3_405b,
)
from fm_pipeline.sim.results import BUCKETS, SimResult

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

PLOT = typer.Option(None, "--plot", help="write PNG plots into this directory")
JSON = typer.Option(False, "--json", help="print the result as JSON instead of tables")


@contextmanager
def _progress(total: int, label: str, *, quiet: bool = False):
    """A rich progress bar; yields a zero-argument `advance` callback."""
    if quiet or total <= 1:
        yield lambda: None
        return
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


def _config(*, gpus, gpus_per_node, days, interval_min, save_blocking_s, persist_s, sync,
            load_s, restart_s, hot_spares, cold_replace_min, failure_scale,
            stragglers_per_node_day, straggler_mitigation, straggler_detect_s) -> SimConfig:
    cfg = llama3_405b()
    ck, rc = cfg.checkpoint, cfg.recovery
    if interval_min is not None:
        ck = ck.with_(interval_s=interval_min * 60)
    if save_blocking_s is not None:
        ck = ck.with_(save_blocking_s=save_blocking_s)
    if persist_s is not None:
        ck = ck.with_(persist_s=persist_s)
    if load_s is not None:
        ck = ck.with_(load_s=load_s)
    if sync:  # the whole write blocks the loop and is durable when it returns
        ck = CheckpointPolicy.sync(interval_s=ck.interval_s, write_s=ck.save_blocking_s + ck.persist_s,
                                   load_s=ck.load_s)
    if restart_s is not None:
        rc = rc.with_(restart_s=restart_s)
    if hot_spares is not None:
        rc = rc.with_(hot_spares=hot_spares)
    if cold_replace_min is not None:
        rc = rc.with_(cold_replace_s=cold_replace_min * 60)
    if failure_scale <= 0:
        raise ValueError(f"--failure-scale must be > 0, got {failure_scale}")
    changes = dict(checkpoint=ck, recovery=rc,
                   failure_modes=tuple(m.scaled(failure_scale) for m in cfg.failure_modes),
                   stragglers=StragglerModel(rate_per_node_day=stragglers_per_node_day,
                                             mitigation=straggler_mitigation,
                                             detect_s=straggler_detect_s))
    if gpus is not None:
        changes["n_gpus"] = gpus
        changes["name"] = f"{gpus}-gpus"
    if gpus_per_node is not None:
        changes["gpus_per_node"] = gpus_per_node
    if days is not None:
        changes["horizon_days"] = days
    return cfg.with_(**changes)


# Knobs shared by `job` and `sweep-interval`; defaults are the Llama 3 405B preset's.
GPUS = typer.Option(None, "--gpus", help="GPUs in the job (default 16,384)")
GPN = typer.Option(None, "--gpus-per-node", help="GPUs per node (default 8)")
DAYS = typer.Option(None, "--days", help="wall-clock days simulated (default 54)")
INTERVAL = typer.Option(None, "--interval-min", help="minutes of training between saves (default 10)")
BLOCK = typer.Option(None, "--save-blocking-s", help="seconds a save stalls training (default 10)")
PERSIST = typer.Option(None, "--persist-s", help="seconds until an async save is durable (default 60)")
SYNC = typer.Option(False, "--sync", help="synchronous saves: blocking + persist stall the loop")
LOAD = typer.Option(None, "--load-s", help="seconds to restore at restart (default 60)")
RESTART = typer.Option(None, "--restart-s", help="relaunch seconds, without the restore (default 240)")
SPARES = typer.Option(None, "--hot-spares", help="hot-spare nodes (default 16)")
COLD = typer.Option(None, "--cold-replace-min", help="minutes to get a node without a spare (default 30)")
SCALE = typer.Option(1.0, "--failure-scale", help="multiply every published failure rate")
STRAG = typer.Option(0.0, "--stragglers-per-node-day", help="fail-slow incidence per node and day")
MITIG = typer.Option("report", "--straggler-mitigation", help="none | report | exclude")
SDETECT = typer.Option(300.0, "--straggler-detect-s", help="seconds until a straggler is flagged")
FAST = typer.Option(False, "--fast-tier", help="in-memory snapshots with a peer replica: a "
                    "failure they survive is an in-job restart from memory (docs/simulation.md)")
FAST_EVERY = typer.Option(30.0, "--fast-interval-s", help="seconds of training between "
                          "snapshots (default 30: the planner's two-level interval for 405B on 16k H100)")
FAST_RESTART = typer.Option(60.0, "--fast-restart-s", help="in-job restart seconds, without "
                            "the restore (default 60: an assumption for a large job's re-rendezvous)")
FAST_LOAD = typer.Option(1.0, "--fast-load-s", help="seconds to restore from memory (default 1)")
FAST_SHARE = typer.Option(None, "--fast-survivable", help="share of one-node failures the fast "
                          "tier survives (default: per failure mode, from what each leaves behind)")


@app.command("job")
@user_errors
def job(
    gpus: int | None = GPUS, gpus_per_node: int | None = GPN, days: float | None = DAYS,
    interval_min: float | None = INTERVAL, save_blocking_s: float | None = BLOCK,
    persist_s: float | None = PERSIST, sync: bool = SYNC, load_s: float | None = LOAD,
    restart_s: float | None = RESTART, hot_spares: int | None = SPARES,
    cold_replace_min: float | None = COLD, failure_scale: float = SCALE,
    stragglers_per_node_day: float = STRAG, straggler_mitigation: str = MITIG,
    straggler_detect_s: float = SDETECT, fast_tier: bool = FAST,
    fast_interval_s: float = FAST_EVERY, fast_restart_s: float = FAST_RESTART,
    fast_load_s: float = FAST_LOAD, fast_survivable: float | None = FAST_SHARE,
    seed: int = typer.Option(0, "--seed", help="first seed"),
    seeds: int = typer.Option(1, "--seeds", help="runs to average (seeds seed..seed+N-1)"),
    plot: Path | None = PLOT, as_json: bool = JSON,
) -> None:
    """Simulate one long job (default: Llama 3 405B's published 54 days on 16,384 GPUs)."""
    from fm_pipeline.sim.single_job import simulate_job

    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    cfg = _config(gpus=gpus, gpus_per_node=gpus_per_node, days=days, interval_min=interval_min,
                  save_blocking_s=save_blocking_s, persist_s=persist_s, sync=sync, load_s=load_s,
                  restart_s=restart_s, hot_spares=hot_spares, cold_replace_min=cold_replace_min,
                  failure_scale=failure_scale, stragglers_per_node_day=stragglers_per_node_day,
                  straggler_mitigation=straggler_mitigation, straggler_detect_s=straggler_detect_s)
    if fast_tier:
        if fast_interval_s <= 0:
            raise ValueError(f"--fast-interval-s must be > 0, got {fast_interval_s}")
        cfg = cfg.with_(fast_tier=FastTierPolicy(
            interval_s=fast_interval_s, restart_s=fast_restart_s, load_s=fast_load_s,
            survivable=fast_survivable))
    elif fast_survivable is not None:
        raise ValueError("--fast-survivable needs --fast-tier")
    results = []
    with _progress(seeds, "simulating", quiet=as_json) as advance:
        for s in range(seed, seed + seeds):
            results.append(simulate_job(cfg.with_(seed=s)))
            advance()
    if as_json:
        print(json.dumps({"config": _jsonable(cfg.summary()),
                          "runs": [_jsonable(r.to_dict()) for r in results]}, indent=2))
    else:
        _print_job(cfg, results)
    if plot is not None:
        from fm_pipeline.sim.plots import plot_lost_by_cause, plot_timeline

        paths = [plot_timeline(results[0], plot / "sim-timeline.png"),
                 plot_lost_by_cause(results[0], plot / "sim-lost-by-cause.png")]
        _print_paths(paths, quiet=as_json)


@app.command("sweep-interval")
@user_errors
def sweep_interval(
    gpus: int | None = GPUS, gpus_per_node: int | None = GPN, days: float | None = DAYS,
    save_blocking_s: float | None = BLOCK, persist_s: float | None = PERSIST, sync: bool = SYNC,
    load_s: float | None = LOAD, restart_s: float | None = RESTART,
    hot_spares: int | None = SPARES, failure_scale: float = SCALE,
    points: int = typer.Option(9, "--points", help="intervals, log-spaced around Young/Daly"),
    spread: float = typer.Option(8.0, "--spread", help="from Daly/spread to Daly x spread"),
    seeds: int = typer.Option(4, "--seeds", help="seeds per interval (shared across intervals)"),
    plot: Path | None = PLOT, as_json: bool = JSON,
) -> None:
    """ETTR against the checkpoint interval, next to the planner's Young/Daly interval."""
    from fm_pipeline.planner.reliability import daly_interval
    from fm_pipeline.sim.sweep import geometric_grid, sweep_checkpoint_interval

    cfg = _config(gpus=gpus, gpus_per_node=gpus_per_node, days=days, interval_min=None,
                  save_blocking_s=save_blocking_s, persist_s=persist_s, sync=sync, load_s=load_s,
                  restart_s=restart_s, hot_spares=hot_spares, cold_replace_min=None,
                  failure_scale=failure_scale, stragglers_per_node_day=0.0,
                  straggler_mitigation="report", straggler_detect_s=300.0)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    proposed = daly_interval(cfg.checkpoint.save_blocking_s, cfg.mtbf_s())
    if not math.isfinite(proposed):
        raise ValueError("no failures configured: every interval is as good as another")
    grid = geometric_grid(proposed, factor=spread, points=points)
    with _progress(len(grid) * seeds, "sweeping", quiet=as_json) as advance:
        result = sweep_checkpoint_interval(cfg, grid, seeds=range(seeds), progress=advance)
    best = max(result, key=lambda p: p.ettr)
    if as_json:
        print(json.dumps({"daly_interval_s": proposed, "optimum_s": best.value,
                          "points": [{"interval_s": p.value, "ettr": p.ettr, "ettr_std": p.ettr_std,
                                      "lost_gpu_hours": p.lost_gpu_hours} for p in result]}, indent=2))
    else:
        table = Table(title=f"ETTR vs checkpoint interval ({cfg.n_gpus:,} GPUs, MTBF "
                            f"{cfg.mtbf_s() / 3600:.2f} h, save stalls {cfg.checkpoint.save_blocking_s:g} s)")
        for col in ("interval", "ETTR", "± std", "lost work GPU-h", "checkpoint GPU-h", ""):
            table.add_column(col, justify="right")
        for p in result:
            mark = "best" if p is best else ""
            table.add_row(_minutes(p.value), f"{p.ettr:.4f}", f"{p.ettr_std:.4f}",
                          f"{p.lost_gpu_hours['lost_work']:,.0f}",
                          f"{p.lost_gpu_hours['checkpoint']:,.0f}", mark)
        console.print(table)
        console.print(f"planner (Daly) proposes {_minutes(proposed)}; simulated optimum "
                      f"{_minutes(best.value)}")
    if plot is not None:
        from fm_pipeline.sim.plots import plot_interval_sweep

        path = plot_interval_sweep(result, plot / "sim-ettr-vs-interval.png", proposed_s=proposed,
                                   proposed_label="planner (Daly)")
        _print_paths([path], quiet=as_json)


@app.command("calibrate")
@user_errors
def calibrate(
    seeds: int = typer.Option(8, "--seeds", help="seeds of the published configuration"),
    sweep_seeds: int = typer.Option(4, "--sweep-seeds", help="seeds per point of the sweeps"),
    plot: Path | None = PLOT, as_json: bool = JSON,
) -> None:
    """Reproduce Llama 3 405B's published interruptions and ETTR; planner vs simulated interval."""
    from fm_pipeline.sim.calibration import calibrate_llama3, calibration_runs

    if seeds < 1 or sweep_seeds < 1:
        raise ValueError("--seeds and --sweep-seeds must be >= 1")
    with _progress(calibration_runs(seeds, sweep_seeds), "calibrating", quiet=as_json) as advance:
        cal = calibrate_llama3(seeds=range(seeds), sweep_seeds=range(sweep_seeds), progress=advance)
    if as_json:
        print(json.dumps(_jsonable(cal.summary()), indent=2))
    else:
        _print_calibration(cal)
    if plot is not None:
        from fm_pipeline.sim.plots import (
            plot_interval_sweep,
            plot_lost_by_cause,
            plot_sweep,
            plot_timeline,
        )

        paths = [
            plot_timeline(cal.runs[0], plot / "sim-llama3-timeline.png"),
            plot_lost_by_cause(cal.runs[0], plot / "sim-llama3-lost-by-cause.png"),
            plot_sweep(cal.restart_sensitivity, plot / "sim-llama3-restart.png",
                       xlabel="relaunch time without restore (s)", threshold=0.90),
        ]
        for i, comp in enumerate(cal.intervals):
            paths.append(plot_interval_sweep(comp.points, plot / f"sim-llama3-interval-{i}.png",
                                             proposed_s=comp.proposed_s,
                                             proposed_label="planner (Daly)"))
        _print_paths(paths, quiet=as_json)


@app.command("tenants")
@user_errors
def tenants(
    trace: Path | None = typer.Option(None, "--trace", help="JSON-lines job trace (default: synthetic)"),
    tenants_file: Path | None = typer.Option(None, "--tenants", help="tenants YAML (default: cluster-sized)"),
    pool_gpus: int = typer.Option(4096, "--pool-gpus", help="GPUs of the default cluster tenants"),
    jobs: int = typer.Option(400, "--jobs", help="jobs in the synthetic trace"),
    load: float = typer.Option(0.9, "--load", help="offered load of the synthetic trace"),
    seed: int = typer.Option(0, "--seed"),
    startup_s: float = typer.Option(300.0, "--startup-s", help="launch + restore per start"),
    stop_s: float = typer.Option(60.0, "--stop-s", help="checkpoint at SIGTERM before exit"),
    plot: Path | None = PLOT, as_json: bool = JSON,
) -> None:
    """Replay a job trace through the fair-share/preemption policy of `fm api`."""
    from fm_pipeline.scheduling import load_tenants
    from fm_pipeline.sim.multitenant import replay
    from fm_pipeline.sim.trace import cluster_tenants, load_trace, synthetic_trace

    config = load_tenants(tenants_file) if tenants_file else cluster_tenants(pool_gpus=pool_gpus)
    jobs_ = load_trace(trace) if trace else synthetic_trace(config, n_jobs=jobs, seed=seed, load=load)
    with _progress(len(jobs_), "replaying", quiet=as_json) as advance:
        result = replay(jobs_, config, startup_s=startup_s, stop_s=stop_s, progress=advance)
    if as_json:
        print(json.dumps(_jsonable(result.to_dict()), indent=2))
    else:
        _print_replay(result)
    if plot is not None:
        from fm_pipeline.sim.plots import plot_replay

        _print_paths([plot_replay(result, plot / "sim-tenants.png")], quiet=as_json)


# --- output -------------------------------------------------------------------------------


def _print_job(cfg: SimConfig, results: list[SimResult]) -> None:
    def stat(get, fmt="{:.4f}"):
        values = [get(r) for r in results]
        text = fmt.format(fmean(values))
        return text + (f" ± {fmt.format(pstdev(values))}" if len(values) > 1 else "")

    ck, rc = cfg.checkpoint, cfg.recovery
    console.print(
        f"[bold]{cfg.name}[/]: {cfg.n_gpus:,} GPUs ({cfg.n_nodes:,} nodes), {cfg.horizon_days:g} days, "
        f"job MTBF {cfg.mtbf_s() / 3600:.2f} h; save every {_minutes(ck.interval_s)} "
        f"(stall {ck.save_blocking_s:g} s, durable after {ck.persist_s:g} s), relaunch "
        f"{rc.restart_s:g} s + restore {ck.load_s:g} s, {rc.hot_spares} hot spares"
        + (f" — {len(results)} seeds" if len(results) > 1 else ""),
        highlight=False,
    )
    fast = cfg.fast_tier
    if fast.interval_s > 0:
        share = ("per failure mode (software bugs, dependencies and silent data corruption "
                 "take the durable path)" if fast.survivable is None
                 else f"{fast.survivable:.0%} of one-node failures")
        console.print(f"fast tier: a snapshot every {fast.interval_s:g} s, an in-job restart "
                      f"of {fast.restart_s:g} s + {fast.load_s:g} s from memory (assumed), "
                      f"surviving {share}", highlight=False)
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("ETTR (effective training time)", stat(lambda r: r.ettr))
    table.add_row("goodput (incl. idle hot spares)", stat(lambda r: r.goodput))
    table.add_row("unplanned interruptions", stat(lambda r: r.interruptions, "{:.1f}"))
    table.add_row("planned interruptions", stat(lambda r: r.planned_interruptions, "{:.1f}"))
    table.add_row("mean time between interruptions (h)", stat(lambda r: r.mtbi_hours, "{:.2f}"))
    if fast.interval_s > 0:
        table.add_row("restarts: in-job from memory / durable",
                      f"{fmean(r.in_job_restarts for r in results):.1f} / "
                      f"{fmean(r.restarts - r.in_job_restarts for r in results):.1f}")
    table.add_row("node swaps: hot spare / cold",
                  f"{fmean(r.spare_swaps for r in results):.1f} / {fmean(r.cold_replacements for r in results):.1f}")
    if cfg.stragglers.rate_per_node_day > 0:
        table.add_row("stragglers: seen / detected / excluded",
                      " / ".join(f"{fmean(getattr(r, k) for r in results):.1f}"
                                 for k in ("stragglers", "stragglers_detected", "stragglers_excluded")))
    console.print(table)
    lost = Table(title="lost GPU-hours by cause")
    lost.add_column("cause")
    lost.add_column("GPU-hours", justify="right")
    lost.add_column("share of all", justify="right")
    total = results[0].total_gpu_hours
    for b in BUCKETS:
        v = fmean(r.lost_gpu_hours[b] for r in results)
        lost.add_row(b, f"{v:,.0f}", f"{v / total:.2%}")
    console.print(lost)
    cats = Table(title="failure cost by root-cause category (lost work + downtime)")
    cats.add_column("category")
    cats.add_column("GPU-hours", justify="right")
    for name, v in results[0].lost_by_category.items():
        cats.add_row(name, f"{v:,.0f}")
    console.print(cats)


def _print_calibration(cal) -> None:
    pub = cal.published
    table = Table(title=f"Llama 3 405B: {pub['gpus']:,} GPUs, {pub['days']} days "
                        f"({len(cal.runs)} seeds)")
    for col in ("", "published", "simulated"):
        table.add_column(col, justify="right")
    table.add_row("unexpected interruptions", str(pub["unexpected_interruptions"]),
                  f"{cal.interruptions_mean:.1f} ± {cal.interruptions_std:.1f}")
    table.add_row("planned interruptions", str(pub["planned_interruptions"]), f"{cal.planned_mean:.1f}")
    table.add_row("effective training time", f"> {pub['effective_training_time_min']:.0%}",
                  f"{cal.ettr_mean:.1%} ± {cal.ettr_std:.1%}")
    console.print(table)
    crossing = cal.max_restart_s_for_published_ettr
    console.print("relaunch time (without restore) that keeps ETTR above 90%: "
                  + (f"<= {crossing:.0f} s" if crossing else "none in the grid"))
    comp = Table(title="checkpoint interval: planner (Young/Daly) vs simulated optimum")
    for col in ("costs", "planner", "best of grid", "fitted optimum", "ETTR at planner's",
                "ETTR at best"):
        comp.add_column(col, justify="right")
    for c in cal.intervals:
        comp.add_row(c.label, _minutes(c.proposed_s), _minutes(c.optimum_s),
                     _minutes(c.fitted_optimum_s), f"{c.ettr_at_proposed:.4f}",
                     f"{c.ettr_at_optimum:.4f}")
    console.print(comp)
    for c in cal.intervals:
        console.print(f"{c.label}: ETTR by interval "
                      + ", ".join(f"{_minutes(p.value)}: {p.ettr:.4f}" for p in c.points),
                      highlight=False)


def _print_replay(r) -> None:
    table = Table(show_header=False, title=f"trace replay: {r.jobs} jobs on {r.pool_gpus:,} GPUs")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("completed", f"{r.completed} of {r.jobs} in {r.wall_hours:.1f} h")
    table.add_row("utilisation while jobs arrive", f"{r.utilisation:.1%}")
    table.add_row("utilisation incl. the drain / productive", f"{r.utilisation_overall:.1%} / {r.productive_utilisation:.1%}")
    table.add_row("queue wait mean / p50 / p95 (h)",
                  f"{r.queue_wait_mean_h:.2f} / {r.queue_wait_p50_h:.2f} / {r.queue_wait_p95_h:.2f}")
    table.add_row("preemptions", f"{r.preemptions} {r.preemptions_by_reason}")
    table.add_row("GPU-hours lost to startups / stops / kills",
                  " / ".join(f"{r.lost_gpu_hours[k]:,.0f}" for k in ("startup", "stop", "killed_work")))
    console.print(table)
    per = Table(title="per tenant")
    for col in ("tenant", "jobs", "GPU-hours", "wait mean (h)", "wait p95 (h)", "preempted"):
        per.add_column(col, justify="right")
    for name, t in r.tenants.items():
        per.add_row(name, str(t.jobs), f"{t.gpu_hours:,.0f}", f"{t.queue_wait_mean_h:.2f}",
                    f"{t.queue_wait_p95_h:.2f}", str(t.preempted))
    console.print(per)


def _print_paths(paths, *, quiet: bool) -> None:
    if not quiet:
        for p in paths:
            console.print(f"wrote {p}", highlight=False)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _jsonable(obj):
    """JSON has no infinity: write null for it."""
    if isinstance(obj, float):
        return None if math.isinf(obj) or math.isnan(obj) else obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "__dataclass_fields__"):
        return _jsonable(vars(obj))
    return obj
