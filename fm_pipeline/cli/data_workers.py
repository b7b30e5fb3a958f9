"""`fm data prepare --workers N`: the data mix as `data_mix_job` in the project's Dagster
instance, its tasks fanned out over N processes by Dagster's multiprocess executor (the
same run the intake sensor launches for a `data_mix` submission), followed step by step.

    fm data prepare --job my.yaml --workers 2
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from fm_pipeline.config import JobSpec
from fm_pipeline.config.site import Site
from fm_pipeline.deploy.instance import write_instance

POLL_S = 0.5


def data_mix_job_def():
    from fm_pipeline.definitions import defs

    return defs.resolve_job_def("data_mix_job")


def run_data_mix_job(spec: JobSpec, job_path: Path, *, store_uri: str, endpoint_url: str | None,
                     workers: int, console: Console) -> None:
    """Run data_mix_job with `workers` processes; raise naming the failed steps."""
    home = write_instance(Site.from_environ().dagster_home)
    os.environ["DAGSTER_HOME"] = str(home)
    logging.getLogger("dagster").setLevel(logging.WARNING)

    from dagster import DagsterInstance, execute_job, reconstructable
    from dagster._core.instance.ref import InstanceRef

    from fm_pipeline.assets.data import data_run_config

    job = spec.model_copy(update={"data": spec.data.model_copy(update={"workers": workers})})
    config = {**data_run_config(job), "resources": {
        "job_spec": {"config": {"path": str(job_path.resolve())}},
        "store": {"config": {"uri": store_uri, "endpoint_url": endpoint_url}}},
        # The step processes log to this terminal too: warnings only, the rows say the rest.
        "loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    # A step process announces itself through Dagster's default console logger, at DEBUG
    # unless the instance sets python_log_level: a line per step across the progress rows.
    # INFO for this run only (its events are stored whatever the level; debug-level
    # messages, such as the IO manager's "Loading file from", are not).
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(
        str(home), overrides={"python_logs": {"python_log_level": "INFO"}}))
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  TextColumn("{task.fields[note]}"), console=console) as progress:
        row = progress.add_task(f"data_mix_job, {workers} processes", total=None, note="")
        done = threading.Event()
        before = _newest(instance)
        follower = threading.Thread(target=_follow, args=(instance, before, progress, row, done),
                                    daemon=True)
        follower.start()
        try:
            result = execute_job(reconstructable(data_mix_job_def), instance=instance,
                                 run_config=config)
        finally:
            done.set()
            follower.join()
    if not result.success:
        failed = [e.step_key for e in result.all_events if e.is_step_failure]
        raise RuntimeError(f"data_mix_job run {result.run_id} failed in "
                           f"{', '.join(failed) or 'its run'}; `dagster dev` shows its logs "
                           f"(DAGSTER_HOME={home})")
    console.print(f"data_mix_job run {result.run_id}: {_steps(instance, result.run_id)} steps",
                  highlight=False)


def _newest(instance) -> str | None:
    from dagster import RunsFilter

    records = instance.get_run_records(RunsFilter(job_name="data_mix_job"), limit=1)
    return records[0].dagster_run.run_id if records else None


def _follow(instance, before: str | None, progress, row, done: threading.Event) -> None:
    """Step counts of the data_mix_job run started after `before`, until it ends."""
    run_id = None
    while not done.wait(POLL_S):
        if run_id is None:
            newest = _newest(instance)
            run_id = newest if newest != before else None
            continue
        progress.update(row, note=f"{_steps(instance, run_id)} steps done")


def _steps(instance, run_id: str) -> int:
    from dagster import DagsterEventType

    return len(instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS))
