"""Finding and creating runs by their fm.* tags, so that every process (Dagster assets, the
trainer's rank 0, a notebook) lands on the same runs without passing ids around.

    from fm_pipeline.tracking.runs import open_client, find_runs
    client = open_client("http://127.0.0.1:5000")
    find_runs(client, experiment_id, {"fm.kind": "job", "fm.job": "demo"})

All functions take an `MlflowClient` (never mlflow's global state: several jobs share one
process in Dagster). mlflow itself is imported only inside functions (~2 s).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fm_pipeline.tracking import names
from fm_pipeline.tracking.params import FlatParams

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

BATCH = 100  # MlflowClient.log_batch takes at most 100 params or tags, 1000 metrics


def open_client(uri: str) -> MlflowClient:
    """A client of `uri`. On a sqlite store the first client creates the schema (MLflow's
    migrations): several processes doing that at once on a new database break it ("Online
    migration expected to match one row", seen with three segment runs starting together),
    so opening the store is serialised by an flock beside the database."""
    from mlflow.tracking import MlflowClient

    database = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    if database is None:
        return MlflowClient(tracking_uri=uri)
    import fcntl

    Path(database).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=uri)
        client._tracking_client.store  # noqa: B018 - opening the store runs the migrations
    return client


def sqlite_artifact_root(uri: str) -> Path | None:
    """Artifacts of a sqlite store live beside the database (<dir>/mlflow-artifacts), not in
    MLflow's default ./mlruns of whatever directory a process happens to run in."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlflow-artifacts"


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, created on first use. Two processes creating it at once both
    end up with the one that won. A server chooses its own artifact location; a sqlite
    store gets sqlite_artifact_root()."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise ValueError(f"MLflow experiment {name!r} is deleted; restore it or pick "
                             f"another name ({names.ENV_EXPERIMENT})")
        return found.experiment_id
    root = sqlite_artifact_root(client.tracking_uri)
    location = (root / name).as_uri() if root else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def tag_filter(tags: Mapping[str, str]) -> str:
    """MLflow search syntax: tags.`fm.job` = 'demo' AND ... (values quoted, quotes escaped)."""
    parts = []
    for key, value in tags.items():
        escaped = str(value).replace("'", "\\'")
        parts.append(f"tags.`{key}` = '{escaped}'")
    return " AND ".join(parts)


def find_runs(client: MlflowClient, experiment: str, tags: Mapping[str, str],
              *, limit: int = 1000) -> list[Run]:
    """Runs of `experiment` carrying all `tags`, oldest first."""
    return list(client.search_runs([experiment], filter_string=tag_filter(tags),
                                   order_by=["attributes.start_time ASC"], max_results=limit))


def find_run(client: MlflowClient, experiment: str, tags: Mapping[str, str]) -> Run | None:
    """The oldest run carrying `tags`: when two processes raced to create it, both later
    agree on the first one."""
    runs = find_runs(client, experiment, tags, limit=1)
    return runs[0] if runs else None


def create_run(client: MlflowClient, experiment: str, *, run_name: str,
               tags: Mapping[str, str], parent_run_id: str | None = None) -> str:
    all_tags = dict(tags)
    if parent_run_id:
        all_tags[names.TAG_PARENT] = parent_run_id
    return client.create_run(experiment, run_name=run_name, tags=all_tags).info.run_id


def log_params(client: MlflowClient, run_id: str, flat: FlatParams) -> None:
    """Log params not yet on the run; a changed value keeps the first (MLflow refuses to
    overwrite) and is reported in the log. Redacted names are recorded as one tag."""
    from mlflow.entities import Param, RunTag

    existing = client.get_run(run_id).data.params
    changed = sorted(k for k, v in flat.params.items() if k in existing and existing[k] != v)
    if changed:
        log.warning("MLflow run %s keeps its first values of %s", run_id, ", ".join(changed))
    new = [Param(k, v) for k, v in sorted(flat.params.items()) if k not in existing]
    for i in range(0, len(new), BATCH):
        client.log_batch(run_id, params=new[i:i + BATCH])
    if flat.redacted:
        client.log_batch(run_id, tags=[RunTag(names.TAG_REDACTED, ",".join(flat.redacted))])


def set_tags(client: MlflowClient, run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(k, str(v)) for k, v in tags.items() if v is not None]
    for i in range(0, len(items), BATCH):
        client.log_batch(run_id, tags=items[i:i + BATCH])


def log_metrics(client: MlflowClient, run_id: str, metrics: Mapping[str, float], *,
                step: int) -> None:
    """Numbers only (bools, strings and None are skipped, not coerced). NaN and inf are
    kept: a diverged loss is exactly what the curve must show."""
    import time

    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    items = [Metric(k, float(v), stamp, step) for k, v in metrics.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i:i + 1000])


def copy_metric_history(client: MlflowClient, source_run_id: str, target_run_id: str,
                        *, after_ms: int = -1) -> int:
    """Append `source`'s metric points logged after `after_ms` (unix ms) to `target`, with
    their steps and timestamps; returns the newest timestamp copied (or `after_ms`), the
    watermark for the next call. The parent run gets one curve across all segments."""
    from mlflow.entities import Metric

    points = []
    for key in client.get_run(source_run_id).data.metrics:
        points += [Metric(key, m.value, m.timestamp, m.step)
                   for m in client.get_metric_history(source_run_id, key)
                   if m.timestamp > after_ms]
    for i in range(0, len(points), 1000):
        client.log_batch(target_run_id, metrics=points[i:i + 1000])
    return max((m.timestamp for m in points), default=after_ms)


def open_trainer_run(client: MlflowClient, *, job_name: str, run_name: str, experiment: str,
                     parent_run_id: str | None) -> str:
    """The trainer's own segment run when the launcher did not create one: a child of
    `parent_run_id` (in the parent's experiment) if given, else a top-level run."""
    if parent_run_id:
        exp_id = client.get_run(parent_run_id).info.experiment_id
    else:
        exp_id = experiment_id(client, experiment)
    return create_run(client, exp_id, run_name=run_name, parent_run_id=parent_run_id,
                      tags={names.TAG_KIND: names.KIND_SEGMENT, names.TAG_JOB: job_name})
