"""`fm demo`: the whole pipeline on this machine, through Dagster, in the project instance.

    fm demo                          # = make demo; the job spec is configs/demo.yaml
    fm demo --job my.yaml --fail-at-step 0      # no injected failure
    make ui                          # dagster dev: the same runs, assets, checks, sensors

Starts a dagster-daemon for the project-local instance (DAGSTER_HOME, default .fm/dagster;
deploy/instance.py writes its dagster.yaml: the run queue, run monitoring) and stops it at
the end; every run is launched by it, recorded there and in MLflow (sqlite under FM_HOME).
fm demo only submits (orchestration.submissions) and follows: the data mix (data_mix_job,
blocking checks), then a new training job (partition "<name>-<n>") from its first segment
to its target step; the daemon's sensors request the rest: the next segment after a
success, a resume after the injected failure (rank 1 raises at --fail-at-step; the retry
policy decides, after its backoff), an evaluation for each new checkpoint; then one restore
drill of the newest checkpoint on a different topology.
Ends with a summary: loss, MFU, tokens/s, goodput, evaluations, drill, where to look, and
the job's training figure (FM_HOME/runs/<job>/training.png, as `fm report <job>` writes it).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer
from rich import box
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from fm_pipeline.cli.data import console
from fm_pipeline.cli.errors import user_errors
from fm_pipeline.cli.options import JOB
from fm_pipeline.config import JobSpec, load_job
from fm_pipeline.config.site import Site
from fm_pipeline.deploy.instance import write_instance
from fm_pipeline.deploy.services import daemon, default_signal_dispositions, running


@user_errors
def demo(job: Path = JOB,
         fail_at_step: int = typer.Option(35, help="rank 1 (or 0) raises after this step in "
                                                   "the segment that reaches it; 0: no fault"),
         backoff_s: float = typer.Option(3.0, help="retry policy: wait before the first resume"),
         ) -> None:
    default_signal_dispositions()  # started in the background, SIGINT may be ignored
    spec = load_job(job)  # a bad spec fails here, before Dagster starts
    if not 0 <= fail_at_step < spec.training.steps:
        raise ValueError(f"--fail-at-step {fail_at_step} must be in 0..{spec.training.steps - 1}")
    site = Site.from_environ()  # the entry point: where this demo's state lives
    home = write_instance(site.dagster_home)
    os.environ["DAGSTER_HOME"] = str(home)
    # The progress rows and the summary say it all; mlflow sets its level when imported.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name in ("dagster", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    t0 = time.monotonic()

    from dagster import DagsterInstance

    from fm_pipeline.cli.follow import RunFollower
    from fm_pipeline.dagster_runs.summary import job_report
    from fm_pipeline.orchestration.submissions import submit_run

    store = site.store()
    training = demo_job(spec, store)
    # What the daemon's runs read from their environment: the demo's short backoff, and
    # torchrun's output to the segment logs only.
    env = {**site.env(), "FM_RETRY_BACKOFF_S": str(backoff_s),
           "FM_LAUNCHER_ECHO": "0", "MLFLOW_LOGGING_LEVEL": "WARNING"}
    with Progress(SpinnerColumn(), TextColumn("{task.description}", table_column=Column(
                      width=34, no_wrap=True)), TimeElapsedColumn(),
                  TextColumn("{task.fields[note]}", table_column=Column(
                      ratio=1, no_wrap=True, overflow="ellipsis")),
                  console=console, expand=True) as progress:
        starting = progress.add_task("dagster-daemon", total=1, note="starting")
        with running(daemon(home, env=env)):
            progress.update(starting, completed=1, note="[green]ready[/] (sensors, schedule, "
                                                         "run queue)")
            instance = DagsterInstance.get()
            follower = RunFollower(progress, instance, training.name,
                                   target_step=spec.training.steps)
            data_key = submit_demo(instance, store, training, fail_at_step=fail_at_step)
            data = follower.wait_for_key(data_key)
            if not data.is_success:
                raise typer.Exit(_failed(instance, data.run_id))
            follower.wait_for_target(api_run=1)
            # The drill queues behind the last evaluations; the initial model's evaluation
            # shares the cores with them, never with a training segment (its figures stand).
            drill_key = submit_run(store, training, kind="drill").run_key
            with ThreadPoolExecutor(1) as pool:
                baseline = pool.submit(_baseline, training, site, store, progress)
                follower.wait_until_idle(api_run=1)
                follower.wait_for_key(drill_key)
                runs = len(follower.rows)
                baseline = baseline.result()
    print_data_mix(spec, store, _check_outcomes(instance, data.run_id))
    report = job_report(instance, training.name, runs=site.runs_dir(training.name))
    print_report(report, training, baseline=baseline, runs=runs, site=site,
                 wall_s=time.monotonic() - t0,
                 figure=_figure(training.name, site, store, baseline))


def demo_job(spec: JobSpec, store) -> JobSpec:
    """`spec` as this demo's new training job: "<name>-<n>", the first n not registered."""
    from fm_pipeline.orchestration import registered_jobs

    taken = set(registered_jobs(store))
    return spec.renamed(next(f"{spec.name}-{n}" for n in range(1, 10_000)
                             if f"{spec.name}-{n}" not in taken))


def submit_demo(instance, store, job: JobSpec, *, fail_at_step: int) -> str:
    """Register `job` and submit its runs for the daemon: the data mix (its run key is
    returned) and the training job from its first segment, with the fault the demo plants
    at `fail_at_step` (0: none)."""
    from fm_pipeline.dagster_runs.names import TAG_API_RUN
    from fm_pipeline.dagster_runs.submit import register_training_job
    from fm_pipeline.orchestration.registry import plant_fault
    from fm_pipeline.orchestration.submissions import submit_run

    register_training_job(instance, job, store=store)
    data_key = submit_run(store, job, kind="data_mix").run_key
    if fail_at_step:
        rank = 1 if job.parallelism.world_size > 1 else 0
        plant_fault(store, job.name, f"{rank}:{fail_at_step}")
    # Submitted together: the run queue starts the job's runs one at a time, in order, so
    # the first segment starts as soon as its data mix is published.
    submit_run(store, job, tags={TAG_API_RUN: "1"})
    return data_key


def _check_outcomes(instance, run_id: str) -> list:
    """The data checks as Dagster evaluated them in the data mix run (not re-run here)."""
    from dagster import AssetCheckSeverity, DagsterEventType

    from fm_pipeline.data.validate import CheckOutcome

    outcomes = []
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        e = record.dagster_event.event_specific_data
        outcomes.append(CheckOutcome(
            name=e.check_name, passed=e.passed, description=e.description or "",
            severity="warn" if e.severity == AssetCheckSeverity.WARN else "error"))
    return outcomes


def print_data_mix(spec, store, outcomes: list) -> None:
    from fm_pipeline.cli.data import print_summary
    from fm_pipeline.data import open_job_mix

    console.print()
    print_summary(open_job_mix(spec, store).manifest, store, outcomes)
    console.print()


def _failed(instance, run_id: str) -> int:
    from fm_pipeline.dagster_runs.history import step_failure

    _, reason = step_failure(instance, run_id)
    console.print(f"[bold red]run {run_id} failed:[/] {reason}")
    return 1


def _baseline(job, site: Site, store, progress: Progress):
    """Held-out loss of the model before its first step (what training must beat)."""
    from fm_pipeline.eval import EvaluationFailed, evaluate_at_init

    task = progress.add_task("evaluate the initial model", total=1, note="running")
    try:
        result = evaluate_at_init(job, site=site, store=store)  # the asset's defaults
    except EvaluationFailed as e:
        progress.update(task, completed=1, note=f"[red]failed:[/] {str(e)[:100]}")
        return None
    progress.update(task, completed=1, note="[green]done[/]")
    return result


def _figure(job_name: str, site: Site, store, baseline) -> Path | str:
    """The job's training figure (fm report), or why there is none."""
    from fm_pipeline.cli.report import write_report

    try:
        return write_report(job_name, site, store=store, baseline=baseline, quiet=True)
    except (ValueError, OSError) as e:  # the runs above are the demo; the figure is a view
        return f"not written: {e}"


def _num(value, fmt: str = "{:.4f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def _router_line(runs: Path) -> str | None:
    """An MoE job's routing at its last step (metrics.jsonl); None for a dense job."""
    from fm_pipeline.rundir.records import read_records

    path = runs / "metrics.jsonl"
    steps = [r for r in read_records(path, "step") if "moe_max_load" in r] \
        if path.exists() else []
    if not steps:
        return None
    last = steps[-1]
    return (f"router at step {last['step']}: the busiest expert took "
            f"{_num(last['moe_max_load'], '{:.2f}')}x the mean load (1 = balanced), "
            f"{last['moe_dropped_slots']:,} of {last['moe_slots']:,} token-slots dropped")


def print_report(report, job, *, baseline, runs: int, site: Site, wall_s: float,
                 figure: Path | str | None = None) -> None:
    segments = Table(title=f"training job {report.job}: segments (one Dagster run each)",
                     title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("steps", "requested by", "outcome", "loss", "MFU", "tokens/s",
                "step s (plan)", "goodput", "wall s"):
        segments.add_column(col, justify="left" if col in ("steps", "requested by", "outcome")
                            else "right")
    events = []
    for i, s in enumerate(report.segments):
        steps = f"{s['start_step']}->{s['end_step']}"
        if s["status"] == "SUCCESS":
            plan = (f"{_num(s.get('step_time_s'), '{:.3f}')} "
                    f"({_num(s.get('predicted_step_time_s'), '{:.3f}')})")
            mfu = 100 * s["mean_mfu"] if s.get("mean_mfu") else None
            segments.add_row(steps, s["trigger"], "[green]completed[/]",
                             _num(s.get("final_loss")), _num(mfu, "{:.1f}%"),
                             _num(s.get("tokens_per_s"), "{:,.0f}"), plan,
                             _num(s.get("goodput"), "{:.2f}"), _num(s.get("wall_s"), "{:.1f}"))
            continue
        at = s.get("failed_at_step")
        where = f"at step {at}" if at is not None and at >= 0 else "before its first step"
        segments.add_row(steps, s["trigger"], f"[red]failed {where}[/]", "-", "-", "-", "-",
                         "0.00", _num(s.get("wall_s"), "{:.1f}"))
        events.append(f"segment {steps} failed {where}: {s.get('reason', '')}")
        events.append(f"  segment_failure_sensor -> [bold]{s.get('decision')}[/]: "
                      f"{s.get('decision_reason') or ''}")
        following = next((t for t in report.segments[i + 1:]
                          if t["trigger"].startswith("resume")), None)
        if s.get("decision") == "resumed" and following is not None:
            events.append(f"  resumed as segment {following['start_step']}->"
                          f"{following['end_step']} from {following.get('resume_from')}")
    console.print(segments)
    for line in events:
        console.print(line, highlight=False)
    if (router := _router_line(site.runs_dir(report.job))) is not None:
        console.print(router, highlight=False)

    checkpoints = Table(title="checkpoints: held-out loss / perplexity per domain, restore drill",
                        title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    domains = sorted({k.split("/")[0] for c in report.checkpoints if c.get("eval")
                      for k in c["eval"] if k.endswith("/loss")})
    for col in ("step", *domains, "all domains", "restore drill"):
        checkpoints.add_column(col, justify="left" if col == "restore drill" else "right")
    if baseline is not None:
        checkpoints.add_row("init", *[_loss_ppl(baseline.domains[n].loss,
                                                baseline.domains[n].perplexity)
                                      for n in domains if n in baseline.domains],
                            _loss_ppl(baseline.loss, baseline.perplexity),
                            "[dim]the model before step 1[/]")
    for c in report.checkpoints:
        e = c.get("eval") or {}
        drill = c.get("drill")
        verdict = "" if not drill else (
            f"[green]passed[/]: {drill['source_topology']} -> {drill['drill_topology']}, "
            f"restored in {drill['restore_s']:.2f} s" if drill["passed"] else
            f"[red]failed[/]: {drill['reasons'][:70]}")
        checkpoints.add_row(str(c["step"]), *[_loss_ppl(e.get(f"{d}/loss"),
                                                        e.get(f"{d}/perplexity"))
                                              for d in domains],
                            _loss_ppl(e.get("loss"), e.get("perplexity")), verdict)
    console.print(checkpoints)
    if report.checkpoints:
        console.print(f"checkpoint URIs: {Path(report.checkpoints[-1]['uri']).parent}/step-*",
                      highlight=False)

    resumed = [s for s in report.segments if s["trigger"].startswith("resume")]
    console.print(
        f"\n[bold]{report.job}[/]: step {report.reached_step}/{job.training.steps} in "
        f"{len(report.segments)} segment launches ({len(resumed)} resumed), job goodput "
        f"{_num(report.goodput, '{:.2f}')} (time in steps that count / wall time of every "
        f"launch); {runs} Dagster runs, {wall_s / 60:.1f} min in all.")
    console.print(
        f"[bold]Dagster[/]: make ui -> http://127.0.0.1:3000/assets/training_segment, partition "
        f"{report.job} (also checkpoint, evaluation, restore_drill); Runs tagged "
        f"fm/job={report.job}. Instance: {site.dagster_home}", highlight=False)
    console.print(
        f"[bold]MLflow[/]: make mlflow-ui -> http://127.0.0.1:5000, experiment fm-pipeline, run "
        f"{report.job} with a child run per segment, evaluation and drill. Store: "
        f"{site.tracking_uri}", highlight=False)
    console.print(f"[bold]Trainer files[/]: {site.runs_dir(report.job)} (metrics.jsonl, "
                  "segments/, checkpoints/)", highlight=False)
    if figure is not None:
        console.print(f"[bold]Training figure[/]: {figure} (loss per launch with the failure and "
                      f"resume, step time, MFU, tokens/s, held-out loss; fm report {report.job})",
                      highlight=False)


def _loss_ppl(loss, ppl) -> str:
    return "-" if loss is None else f"{loss:.3f} / {ppl:.0f}"


__all__ = ["demo"]
