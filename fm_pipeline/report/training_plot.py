"""One PNG of a training job (matplotlib, Agg backend; imported only when plotting).

    from fm_pipeline.report import read_run_history, plot_training
    plot_training(read_run_history("demo-1", site.runs_dir("demo-1")), "training.png")

Panels: training loss against step (one colour per launch, steps a later launch redid
faded, failures/preemptions and the resumes after them as vertical lines, checkpoints as
diamonds), step time, MFU, tokens/s, and held-out loss per data domain at each evaluated
checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from fm_pipeline.plotting import save_figure  # noqa: E402
from fm_pipeline.report.run_history import Launch, RunHistory  # noqa: E402

_EVENT_COLOURS = {"failed": "tab:red", "preempted": "tab:orange", "no end record": "tab:gray"}
_FADED = 0.45
# Launch colours avoid the event lines' red, orange and green.
_LAUNCH_COLOURS = ("tab:blue", "tab:purple", "tab:cyan", "tab:brown", "tab:pink", "tab:olive",
                   "navy", "tab:gray")


def plot_training(history: RunHistory, path: str | Path) -> Path:
    fig = plt.figure(figsize=(12, 10.5))
    grid = fig.add_gridspec(3, 2, height_ratios=[1.4, 1, 1])
    loss = fig.add_subplot(grid[0, :])
    step_time = fig.add_subplot(grid[1, 0], sharex=loss)
    mfu = fig.add_subplot(grid[1, 1], sharex=loss)
    tokens = fig.add_subplot(grid[2, 0], sharex=loss)
    heldout = fig.add_subplot(grid[2, 1])

    _loss_panel(loss, history)
    _metric_panel(step_time, history, "step_time_s", "step time (s)", clip_outliers=True)
    if any(isinstance(r.get("mfu"), (int, float)) for r in history.kept()):
        _metric_panel(mfu, history, "mfu", "MFU (%)", scale=100.0)
    else:
        _note(mfu, "no MFU: the device's peak FLOP/s is unknown")
    _metric_panel(tokens, history, "tokens_per_s", "tokens/s")
    _heldout_panel(heldout, history)
    heldout.set_xlim(loss.get_xlim())  # checkpoint steps line up with the training steps
    for ax in (step_time, mfu, tokens):
        _event_lines(ax, history, labelled=False)

    s = history.summary()
    target = f"/{s['target_step']}" if s["target_step"] else ""
    fig.suptitle(f"{history.job}: step {s['step']}{target} in {s['launches']} launches, "
                 f"{s['failures']} failed, {s['preemptions']} preempted, "
                 f"{s['lost_steps']} steps lost to resumes", fontsize=13)
    return _save(fig, path)


def _colour(i: int) -> str:
    return _LAUNCH_COLOURS[i % len(_LAUNCH_COLOURS)]


def _split(history: RunHistory, launch: Launch) -> tuple[list[dict], list[dict]]:
    lost = history.lost(launch)
    lost_ids = {id(r) for r in lost}
    return [r for r in launch.steps if id(r) not in lost_ids], lost


def _series(records: list[dict], key: str, scale: float = 1.0) -> tuple[list, list]:
    points = [(r["step"], r[key] * scale) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def _loss_panel(ax, history: RunHistory) -> None:
    handles = []
    for i, launch in enumerate(history.launches):
        if not launch.steps:
            continue
        kept, lost = _split(history, launch)
        xs, ys = _series(kept, "loss")
        label = f"launch {i + 1}: {launch.start_step}->{launch.end_step} {launch.outcome}"
        handles += ax.plot(xs, ys, "-", color=_colour(i), lw=1.4, label=label)
        if lost:
            # The lost stretch starts at the launch's last kept point, so the curve is unbroken.
            xs, ys = _series(kept[-1:] + lost, "loss")
            ax.plot(xs, ys, ":", color=_colour(i), lw=1.4, alpha=_FADED)
    if history.lost_steps:
        handles.append(Patch(color="tab:red", alpha=0.12,
                             label=f"lost: trained (dotted), redone ({history.lost_steps} steps)"))
    kept = history.kept()
    saves = history.checkpoints if kept else []
    if saves:
        xs = [c.step for c in saves]
        ys = [_loss_at(kept, c.step) for c in saves]
        ax.scatter(xs, ys, marker="D", s=36, zorder=3, edgecolors="black",
                   c=["black" if c.committed else "white" for c in saves])
        handles.append(Line2D([], [], ls="", marker="D", markerfacecolor="black",
                              markeredgecolor="black",
                              label="checkpoint (hollow: since removed)"))
    handles += _event_lines(ax, history, labelled=True)
    ax.set_ylabel("training loss")
    ax.set_xlabel("step")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    # Headroom above the curve for the legend, below it for the event labels.
    low, high = ax.get_ylim()
    ax.set_ylim(low - 0.08 * (high - low), high + 0.45 * (high - low))
    ax.legend(handles=handles, fontsize=8, loc="upper right", ncol=2)


def _loss_at(kept: list[dict], step: int) -> float:
    """The kept loss at `step`, interpolated between logged steps when it was not logged."""
    before = [r for r in kept if r["step"] <= step]
    after = [r for r in kept if r["step"] >= step]
    if not before or not after:
        return (before or after)[-1 if before else 0]["loss"]
    a, b = before[-1], after[0]
    if a["step"] == b["step"]:
        return a["loss"]
    return a["loss"] + (b["loss"] - a["loss"]) * (step - a["step"]) / (b["step"] - a["step"])


def _event_lines(ax, history: RunHistory, *, labelled: bool) -> list:
    """A line where a launch failed or was preempted, and a dashed one where the next
    launch resumed (the stretch between them is lost work). Returns legend handles."""
    seen: dict[str, Line2D] = {}
    for i, launch in enumerate(history.launches):
        last = i == len(history.launches) - 1
        if launch.interrupted and not (last and launch.record is None):  # last may be running
            colour = _EVENT_COLOURS.get(launch.outcome, "tab:red")
            ax.axvline(launch.end_step, color=colour, lw=1.5, alpha=0.8)
            if lost := history.lost_steps_of(launch):
                ax.axvspan(launch.end_step - lost, launch.end_step, color="tab:red", alpha=0.12)
            seen.setdefault(launch.outcome, Line2D([], [], color=colour, lw=1.5,
                                                   label=f"{launch.outcome} after this step"))
            if labelled:
                ax.annotate(f"{launch.outcome} after step {launch.end_step}",
                            (launch.end_step, 0), xycoords=("data", "axes fraction"),
                            xytext=(-3, 16), textcoords="offset points", color=colour,
                            fontsize=8, ha="right")
        if i and history.launches[i - 1].interrupted:
            ax.axvline(launch.start_step, color="tab:green", ls="--", lw=1.3, alpha=0.8)
            seen.setdefault("resumed", Line2D([], [], color="tab:green", ls="--", lw=1.3,
                                              label="resumed from this step"))
            if labelled:
                ax.annotate(f"resumed from {launch.start_step}", (launch.start_step, 0),
                            xycoords=("data", "axes fraction"), xytext=(-3, 4),
                            textcoords="offset points", color="tab:green", fontsize=8,
                            ha="right")
    return list(seen.values())


def _metric_panel(ax, history: RunHistory, key: str, label: str, *, scale: float = 1.0,
                  clip_outliers: bool = False) -> None:
    values = []
    for i, launch in enumerate(history.launches):
        kept, lost = _split(history, launch)
        xs, ys = _series(kept, key, scale)
        ax.plot(xs, ys, "-", color=_colour(i), lw=1.1)
        values += ys
        if lost:
            xs, ys = _series(kept[-1:] + lost, key, scale)
            ax.plot(xs, ys, ":", color=_colour(i), lw=1.1, alpha=_FADED)
    if clip_outliers and values and max(values) > 4 * median(values) > 0:
        ax.set_ylim(0, 4 * median(values))  # first steps of a launch (warm-up) go off scale
        ax.set_title(f"{label} (warm-up steps above {4 * median(values):.2g} off scale)",
                     fontsize=10)
    else:
        ax.set_title(label, fontsize=10)
        ax.set_ylim(bottom=0)
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)


def _heldout_panel(ax, history: RunHistory) -> None:
    evaluated = history.evaluations()
    if not evaluated:
        _note(ax, "no held-out evaluations of this job's checkpoints")
        return
    domains = sorted({d for c in evaluated for d in c.heldout()} - {"all domains"})
    for i, domain in enumerate([*domains, "all domains"]):
        points = [(c.step, c.heldout()[domain]) for c in evaluated if domain in c.heldout()]
        style = dict(color="black", ls="--") if domain == "all domains" else dict(color=f"C{i}")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=domain,
                **style)
    initial = ", step 0: the initial model" if history.baseline else ""
    ax.set_title(f"held-out loss per domain (evaluated checkpoints{initial})", fontsize=10)
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    # tick_params, not set_xticks: the step axis is shared with the other panels
    ax.tick_params(left=False, bottom=False, labelleft=False, labelbottom=False)


def _save(fig, path: str | Path) -> Path:
    return save_figure(fig, path, dpi=100)
