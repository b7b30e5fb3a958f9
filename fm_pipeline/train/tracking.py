"""Rank 0's outside reporting: MLflow (when a tracking URI is configured) and Dagster Pipes
(when launched by Dagster). Both import lazily: mlflow costs ~2 s, and workers that report
nothing should not pay for it.

MLflow (run model and env vars: fm_pipeline.tracking, docs/tracking.md) is enabled by
FM_MLFLOW_URI or MLFLOW_TRACKING_URI. The run: FM_MLFLOW_RUN_ID if the launcher created one
(the orchestrator's per-segment child run; the orchestrator ends it), else a segment run of
our own (a child of FM_MLFLOW_PARENT_RUN_ID if set, in FM_MLFLOW_EXPERIMENT) that we end.
Params: the whole job spec and the plan (mesh, world, FLOPs), credentials dropped; metrics
every step, logged from a background thread so a slow tracking server never stalls a step.

Pipes: only when DAGSTER_PIPES_CONTEXT is in the environment (every rank inherits it; only
global rank 0 may open it). At the segment's end: a custom message {"segment": summary}, and, when
the segment completed or was preempted (a checkpoint was committed) and exactly one asset is
in scope, an asset materialization with the summary's scalars as metadata. A failure is
reported as the Pipes session's exception.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fm_pipeline.tracking import names, runs
from fm_pipeline.tracking.params import flatten_params

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerTracking:
    """Where rank 0 logs its segment in MLflow, as the launcher said (tracking/names.py):
    parsed by the worker's entry point from its environment and passed down."""

    uri: str | None = None  # None: not tracked in MLflow (metrics.jsonl still is)
    run_id: str | None = None  # the launcher's run; None: rank 0 opens its own
    experiment: str = names.DEFAULT_EXPERIMENT
    parent_run_id: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TrainerTracking:
        return cls(uri=env.get(names.ENV_URI) or env.get("MLFLOW_TRACKING_URI") or None,
                   run_id=env.get(names.ENV_RUN_ID) or None,
                   experiment=env.get(names.ENV_EXPERIMENT, names.DEFAULT_EXPERIMENT),
                   parent_run_id=env.get(names.ENV_PARENT_RUN_ID) or None)


PROBE_TIMEOUT_S = 3.0


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ConnectionError at once if an HTTP tracking server does not answer: MLflow's
    own client retries for about four minutes before giving up, and a segment must not
    wait that long to start because tracking is down."""
    if not uri.startswith(("http://", "https://")):
        return  # a file or database store: nothing to reach
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (an old server without /health, or a proxy in front)
    except OSError as e:
        raise ConnectionError(f"no answer from the MLflow server at {uri}: {e}") from None


class MlflowSink:
    """Rank 0's MLflow run of a segment. It opens on its own thread (mlflow's import, the
    server probe, the run and its params: ~3 s on 2 cores, paid again by every in-job
    restart), so the first step never waits for tracking; metrics and tags queue until it
    is open. Unusable (`ready` set, `usable` False): a warning, and the queue is dropped."""

    def __init__(self, tracking: TrainerTracking, *, job_name: str, params: dict[str, Any],
                 run_name: str):
        self.uri, self.tracking = tracking.uri, tracking
        self.client = None
        self.run_id = tracking.run_id
        self.own_run = not self.run_id
        self.usable = False
        self.ready = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(job_name, params, run_name),
                                        name="fm-mlflow", daemon=True)
        self._thread.start()

    def log_metrics(self, step: int, metrics: dict[str, float | None]) -> None:
        self._queue.put(("metrics", step, {k: v for k, v in metrics.items() if v is not None}))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._queue.put(("tags", None, tags))

    def _open(self, job_name: str, params: dict[str, Any], run_name: str) -> None:
        probe_server(self.uri)
        self.client = runs.open_client(self.uri)
        if self.own_run:
            self.run_id = runs.open_trainer_run(
                self.client, job_name=job_name, run_name=run_name,
                experiment=self.tracking.experiment,
                parent_run_id=self.tracking.parent_run_id)
        runs.log_params(self.client, self.run_id, flatten_params(params))

    def _run(self, job_name: str, params: dict[str, Any], run_name: str) -> None:
        try:
            self._open(job_name, params, run_name)
            self.usable = True
        except Exception as e:  # tracking must never take training down
            log.warning("MLflow at %s unusable, this segment is not tracked there "
                        "(metrics.jsonl still is): %s", self.uri, e)
        finally:
            self.ready.set()
        while (item := self._queue.get()) is not None:
            if not self.usable:
                continue
            kind, step, values = item
            try:
                if kind == "metrics":
                    runs.log_metrics(self.client, self.run_id, values, step=step)
                else:
                    runs.set_tags(self.client, self.run_id, values)
            except Exception as e:  # tracking must never take training down
                log.warning("MLflow %s of step %s not logged: %s", kind, step, e)

    def close(self, *, summary: dict[str, Any], failed: bool) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        if not self.usable:
            return
        try:
            runs.set_tags(self.client, self.run_id, {
                names.TAG_START_STEP: summary.get("start_step"),
                names.TAG_END_STEP: summary.get("end_step"),
                "fm.exit_reason": summary.get("exit_reason"),
                names.TAG_CHECKPOINT_URI: summary.get("checkpoint")})
            if self.own_run:  # the launcher's run is the launcher's to end
                self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
        except Exception as e:
            log.warning("MLflow run not closed: %s", e)


class PipesSink:
    def __init__(self):
        from dagster_pipes import PipesContext, open_dagster_pipes

        if PipesContext.is_initialized() and PipesContext.get().is_closed:
            # A segment run again in the process (train.inprocess): a new session, as a
            # restarted worker process would open; dagster_pipes keeps one per process.
            PipesContext._instance = None
        self.pipes = open_dagster_pipes()

    def log(self, message: str) -> None:
        self.pipes.log.info(message)

    def close(self, *, summary: dict[str, Any], error: BaseException | None) -> None:
        metadata = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))}
        try:
            # A failed segment produced nothing new; a preempted one committed a checkpoint.
            progressed = error is None and summary.get("exit_reason") in ("completed", "preempted")
            if progressed and self.pipes.is_asset_step and len(self.pipes.asset_keys) == 1:
                self.pipes.report_asset_materialization(metadata=metadata)
            self.pipes.report_custom_message({"segment": summary})
        finally:
            if error is not None:
                self.pipes.__exit__(type(error), error, error.__traceback__)
            else:
                self.pipes.close()


def pipes_requested() -> bool:
    return "DAGSTER_PIPES_CONTEXT" in os.environ
