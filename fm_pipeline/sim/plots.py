"""PNG plots of simulation results (matplotlib, Agg backend; imported only when plotting).

    from fm_pipeline.sim.plots import plot_timeline, plot_lost_by_cause, plot_interval_sweep
    plot_timeline(result, "out/sim-timeline.png")
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fm_pipeline.plotting import save_figure  # noqa: E402
from fm_pipeline.sim.results import BUCKETS, SimResult  # noqa: E402

_LABELS = {
    "lost_work": "lost work (recomputed)",
    "detection": "detection",
    "replacement": "node replacement",
    "restart": "relaunch + restore",
    "checkpoint": "checkpoint stalls",
    "stragglers": "straggler slowdown",
}


def _save(fig, path: str | Path) -> Path:
    return save_figure(fig, path, dpi=110)


def plot_timeline(result: SimResult, path: str | Path, *, max_points: int = 4000) -> Path:
    """Training progress against wall-clock time; the gap to the diagonal is lost time."""
    tl = result.timeline
    step = max(1, len(tl) // max_points)
    t = [p[0] / 24 for p in tl[::step]] + [tl[-1][0] / 24]
    w = [p[1] / 24 for p in tl[::step]] + [tl[-1][1] / 24]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([0, t[-1]], [0, t[-1]], ls="--", color="grey", lw=1, label="no failures, no stalls")
    ax.plot(t, w, color="tab:blue", lw=1.2, label=f"simulated (ETTR {result.ettr:.1%})")
    ax.set_xlabel("wall-clock days")
    ax.set_ylabel("days of training progress kept")
    ax.set_title(f"{result.name}: {result.n_gpus:,} GPUs, {result.interruptions} interruptions")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_lost_by_cause(result: SimResult, path: str | Path) -> Path:
    """Lost GPU-hours per bucket, and per root-cause category of the failures."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    buckets = [b for b in BUCKETS if result.lost_gpu_hours.get(b, 0) > 0]
    ax1.barh([_LABELS[b] for b in buckets], [result.lost_gpu_hours[b] / 1e3 for b in buckets],
             color="tab:red")
    ax1.set_xlabel("thousand GPU-hours")
    ax1.set_title(f"lost GPU-hours by phase ({result.lost_total_gpu_hours / result.total_gpu_hours:.1%} of all)")
    cats = list(result.lost_by_category)
    ax2.barh(cats, [result.lost_by_category[c] / 1e3 for c in cats], color="tab:orange")
    ax2.set_xlabel("thousand GPU-hours")
    ax2.set_title("failure cost by root cause (lost work + downtime)")
    for ax in (ax1, ax2):
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def plot_interval_sweep(points, path: str | Path, *, proposed_s: float | None = None,
                        proposed_label: str = "Young/Daly") -> Path:
    """ETTR against the checkpoint interval (mean +- std over seeds)."""
    xs = [p.value / 60 for p in points]
    ys = [p.ettr for p in points]
    sd = [p.ettr_std for p in points]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.errorbar(xs, ys, yerr=sd, marker="o", capsize=3, label="simulated ETTR")
    best = max(points, key=lambda p: p.ettr)
    ax.axvline(best.value / 60, color="tab:green", ls=":", label=f"simulated optimum {best.value / 60:.1f} min")
    if proposed_s is not None:
        ax.axvline(proposed_s / 60, color="tab:red", ls="--", label=f"{proposed_label} {proposed_s / 60:.1f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes of training between saves)")
    ax.set_ylabel("effective training time ratio")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, path)


def plot_sweep(points, path: str | Path, *, xlabel: str, threshold: float | None = None) -> Path:
    """ETTR against any swept knob (e.g. relaunch time, failure-rate factor)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.errorbar([p.value for p in points], [p.ettr for p in points],
                yerr=[p.ettr_std for p in points], marker="o", capsize=3)
    if threshold is not None:
        ax.axhline(threshold, color="tab:red", ls="--", label=f"published: > {threshold:.0%}")
        ax.legend()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("effective training time ratio")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_replay(result, path: str | Path) -> Path:
    """Multi-tenant replay: pool utilisation over time and queue wait per tenant."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    tl = result.utilisation_timeline
    xs, ys = [], []
    for (t0, u0), (t1, _) in zip(tl, tl[1:] + [(result.wall_hours, tl[-1][1])]):
        xs += [t0, t1]
        ys += [u0, u0]
    ax1.plot(xs, ys, lw=0.8)
    ax1.set_ylim(0, 1.05)
    ax1.set_xlabel("hours")
    ax1.set_ylabel("fraction of the pool held")
    ax1.set_title(f"utilisation {result.utilisation:.0%} while jobs arrive, "
                  f"{result.preemptions} preemptions")
    names = list(result.tenants)
    ax2.bar(names, [result.tenants[n].queue_wait_p95_h for n in names], color="tab:orange",
            alpha=0.45, label="p95")
    ax2.bar(names, [result.tenants[n].queue_wait_mean_h for n in names], color="tab:blue",
            label="mean")
    ax2.set_ylabel("queue wait (hours)")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    return _save(fig, path)
