"""`fm demo`: run the main job end to end on the embedded defaults, through Dagster.

    fm demo                          # = make demo; the job spec is configs/demo.yaml
    fm demo --job my.yaml
    make ui                          # dagster dev: the same runs, materializations and checks

Today the main job is the data mix: `data_mix_job` (clean_documents -> tokenizer ->
token_shards -> data_mix, with blocking checks) runs in the project-local Dagster instance
(DAGSTER_HOME, default .fm/dagster). A second run reuses every stage and takes seconds.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from fm_pipeline.cli.data import console, print_summary
from fm_pipeline.cli.errors import user_errors
from fm_pipeline.config import load_job
from fm_pipeline.config.paths import dagster_home

JOB_NAME = "data_mix_job"


@user_errors
def demo(job: Path = typer.Option(Path("configs/demo.yaml"), "--job", "-j", help="job spec YAML")) -> None:
    spec = load_job(job)  # a bad spec fails here, before Dagster starts
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    (home / "dagster.yaml").touch()  # a project-local instance (sqlite), no first-run banner

    from dagster import DagsterInstance, FilesystemIOManager

    from fm_pipeline.data import open_job_mix
    from fm_pipeline.definitions import defs
    from fm_pipeline.resources.store import ObjectStoreResource

    instance = DagsterInstance.get()
    job_def = defs.resolve_job_def(JOB_NAME)
    run_id = str(uuid.uuid4())
    console.print(f"[bold]{JOB_NAME}[/] for job [bold]{spec.name}[/] ({job}) in Dagster instance {home}")
    outcome: dict = {}

    def execute() -> None:
        try:
            outcome["result"] = job_def.execute_in_process(
                instance=instance, run_id=run_id, raise_on_error=False,
                run_config={
                    "resources": {"job_spec": {"config": {"path": str(job)}}},
                    "loggers": {"console": {"config": {"log_level": "WARNING"}}},
                },
                # execute_in_process keeps outputs in memory unless told otherwise; on disk,
                # later runs (the UI, downstream assets) can load data_mix's MixRef.
                resources={"io_manager": FilesystemIOManager(base_dir=instance.storage_directory())},
            )
        except BaseException as e:  # surfaced in the main thread
            outcome["error"] = e

    worker = threading.Thread(target=execute, name="dagster-run", daemon=True)
    worker.start()
    _follow_run(instance, run_id, worker, _step_order(job_def.graph.node_names()))
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    if not result.success:
        for event in result.get_step_failure_events():
            console.print(f"[bold red]step {event.step_key} failed:[/] {event.step_failure_data.error.message.strip()}")
        console.print(f"run {run_id} failed; details in the Dagster UI (`make ui`)")
        raise typer.Exit(1)
    from fm_pipeline.data.validate import CheckOutcome

    checks = [
        CheckOutcome(e.check_name, e.passed, e.description or "",
                     severity="warn" if e.severity.value == "WARN" else "error")
        for e in result.get_asset_check_evaluations()
    ]
    store = ObjectStoreResource().open()
    print_summary(open_job_mix(spec, store).manifest, store, checks)
    console.print(f"run {run_id} recorded in {home}; browse it with `make ui` (dagster dev -w workspace.yaml)")


def _step_order(names: list[str]) -> list[str]:
    """Steps in lineage order: each data asset followed by its checks."""
    from fm_pipeline.assets.data import DATA_ASSETS

    order = [n for a in DATA_ASSETS for n in (a.key.to_user_string(), f"{a.key.to_user_string()}_checks")]
    return sorted(names, key=lambda n: order.index(n) if n in order else len(order))


def _follow_run(instance, run_id: str, worker: threading.Thread, steps: list[str]) -> None:
    """Draw one row per step from the run's event log while the run executes in `worker`."""
    with Progress(SpinnerColumn(), TextColumn("{task.description:<24}"), TimeElapsedColumn(),
                  TextColumn("{task.fields[note]}"), console=console) as progress:
        rows = {s: progress.add_task(s, total=1, start=False, note="waiting") for s in steps}
        cursor = None
        while True:
            alive = worker.is_alive()
            cursor = _apply_events(instance, run_id, cursor, progress, rows)
            if not alive:
                break
            time.sleep(0.3)


def _apply_events(instance, run_id: str, cursor, progress: Progress, rows: dict) -> str | None:
    try:
        conn = instance.get_records_for_run(run_id, cursor=cursor, limit=1000)
    except Exception:  # the run is not registered yet
        return cursor
    for record in conn.records:
        entry = record.event_log_entry
        task = rows.get(entry.step_key or "")
        if task is None:
            continue
        event = entry.dagster_event
        kind = event.event_type_value if event else "LOG"
        if kind == "STEP_START":
            progress.start_task(task)
            progress.update(task, note="running")
        elif kind == "STEP_SUCCESS":
            progress.update(task, completed=1, note="[green]done[/]")
            progress.stop_task(task)
        elif kind == "STEP_FAILURE":
            progress.update(task, note="[red]failed[/]")
            progress.stop_task(task)
        elif kind == "STEP_SKIPPED":
            progress.update(task, note="[yellow]skipped (upstream failed)[/]")
        elif kind == "ASSET_CHECK_EVALUATION":
            data = event.event_specific_data
            mark = "[green]passed[/]" if data.passed else "[red]failed[/]"
            progress.update(task, note=f"{data.check_name} {mark}")
        elif kind == "LOG" and entry.user_message:
            progress.update(task, note=entry.user_message[:90])
    return conn.cursor if conn.records else cursor


__all__ = ["demo"]
