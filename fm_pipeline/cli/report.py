"""`fm report JOB`: one PNG of a training job and a short summary of it.

    fm report demo-1                     # -> FM_HOME/runs/demo-1/training.png
    fm report demo-1 --out loss.png

Reads FM_HOME/runs/<job>/ (metrics.jsonl, segments.jsonl, checkpoints and their eval
marks) and the object store's checkpoint copies; see fm_pipeline.report.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.config.site import Site

console = Console()
FIGURE = "training.png"


@user_errors
def report(job: str = typer.Argument(..., help="the training job's name (FM_HOME/runs/<job>)"),
           out: Path = typer.Option(None, "--out", "-o", help=f"PNG path (default: "
                                    f"FM_HOME/runs/<job>/{FIGURE})"),
           ) -> None:
    path = write_report(job, Site.from_environ(), out=out)
    console.print(f"figure: {path}", highlight=False)


def write_report(job: str, site: Site, *, out: Path | None = None, store=None,
                 baseline=None, quiet: bool = False) -> Path:
    """Write the job's figure and print its summary; the figure's path. `baseline`: the
    initial model's EvalResult, drawn at step 0 of the held-out panel. Raises NoMetrics (a
    ValueError naming the job) when the job has no step records."""
    from fm_pipeline.report import plot_training, read_run_history

    if store is None:
        store = _default_store(site)
    history = read_run_history(job, site.runs_dir(job), store=store)
    history.baseline = baseline.to_dict() if baseline is not None else None
    path = plot_training(history, out or site.runs_dir(job) / FIGURE)
    if not quiet:
        print_summary(history.summary())
    return path


def _default_store(site: Site):
    from fm_pipeline.storage import StoreError

    try:
        return site.store()
    except StoreError:  # the local tier is enough for a figure
        return None


def _fmt(value, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def print_summary(s: dict) -> None:
    target = f"/{s['target_step']}" if s["target_step"] else ""
    events = []
    if s["failures"]:
        events.append(f"{s['failures']} failed")
    if s["preemptions"]:
        events.append(f"{s['preemptions']} preempted")
    launches = f"{s['launches']} launches" + (f" ({', '.join(events)})" if events else "")
    mfu = _fmt(100 * s["median_mfu"] if s["median_mfu"] is not None else None, "{:.1f}%")
    console.print(
        f"[bold]{s['job']}[/]: step {s['step']}{target} in {launches}; "
        f"final loss [bold]{s['final_loss']:.4f}[/]\n"
        f"  median step time {_fmt(s['median_step_time_s'], '{:.3f}')} s, MFU {mfu}, "
        f"{_fmt(s['median_tokens_per_s'], '{:,.0f}')} tokens/s; "
        f"lost steps {s['lost_steps']} (trained, then redone after a resume)\n"
        f"  checkpoints at {_steps(s['checkpoints'])}; evaluated: {_steps(s['evaluated'])}",
        highlight=False)


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


__all__ = ["report", "write_report"]
