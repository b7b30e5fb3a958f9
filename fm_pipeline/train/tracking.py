"""Rank 0's outside reporting: MLflow (when a tracking URI is configured) and Dagster Pipes
(when launched by Dagster). Both import lazily: mlflow costs ~2 s, and workers that report
nothing should not pay for it.

MLflow is enabled by FM_MLFLOW_URI or MLFLOW_TRACKING_URI. The run: FM_MLFLOW_RUN_ID if the
launcher created one (e.g. the orchestrator's per-segment child run), else a new run in
experiment FM_MLFLOW_EXPERIMENT (default "fm-pipeline"), a child of FM_MLFLOW_PARENT_RUN_ID if
set. Params: the whole job spec (dotted keys) and the plan (mesh, world, FLOPs); metrics
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
import time
from typing import Any

log = logging.getLogger(__name__)

MLFLOW_BATCH = 100  # MlflowClient.log_batch accepts at most 100 params / 1000 metrics


def tracking_uri() -> str | None:
    return os.environ.get("FM_MLFLOW_URI") or os.environ.get("MLFLOW_TRACKING_URI") or None


def flatten(prefix: str, value: Any) -> dict[str, str]:
    """Dotted-key params; lists become JSON; credential keys dropped (fm_pipeline.tracking)."""
    from fm_pipeline.tracking.params import flatten_params

    return flatten_params({prefix: value} if prefix else value).params


class MlflowSink:
    def __init__(self, uri: str, *, job_name: str, params: dict[str, Any], run_name: str):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        run_id = os.environ.get("FM_MLFLOW_RUN_ID")
        if not run_id:  # shared with the orchestrator: same tags, same experiment lookup
            from fm_pipeline.tracking.runs import open_trainer_run

            run_id = open_trainer_run(
                self.client, job_name=job_name, run_name=run_name,
                experiment=os.environ.get("FM_MLFLOW_EXPERIMENT", "fm-pipeline"),
                parent_run_id=os.environ.get("FM_MLFLOW_PARENT_RUN_ID"))
        self.run_id = run_id
        flat = [Param(k, v) for k, v in sorted(flatten("", params).items())]
        for i in range(0, len(flat), MLFLOW_BATCH):
            try:
                self.client.log_batch(run_id, params=flat[i:i + MLFLOW_BATCH])
            except Exception as e:  # a resumed segment re-logging into its run: keep the first
                log.warning("MLflow params not logged (already set?): %s", e)
                break
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="fm-mlflow", daemon=True)
        self._thread.start()

    def log_metrics(self, step: int, metrics: dict[str, float | None]) -> None:
        self._queue.put((step, {k: v for k, v in metrics.items() if v is not None}))

    def _drain(self) -> None:
        from mlflow.entities import Metric

        while True:
            item = self._queue.get()
            if item is None:
                return
            step, metrics = item
            stamp = int(time.time() * 1000)
            try:
                self.client.log_batch(self.run_id, metrics=[
                    Metric(k, float(v), stamp, step) for k, v in metrics.items()])
            except Exception as e:
                log.warning("MLflow metrics of step %d not logged: %s", step, e)

    def close(self, *, summary: dict[str, Any], failed: bool) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        try:
            self.client.set_tag(self.run_id, "fm.exit_reason", str(summary.get("exit_reason")))
            if not os.environ.get("FM_MLFLOW_RUN_ID"):  # our own run: we end it
                self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
        except Exception as e:
            log.warning("MLflow run not closed: %s", e)


class PipesSink:
    def __init__(self):
        from dagster_pipes import open_dagster_pipes

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
