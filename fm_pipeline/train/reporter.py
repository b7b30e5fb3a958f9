"""Rank 0's reporting of a segment: JSON lines (metrics.py documents them), MLflow, Dagster
Pipes, and progress on the terminal (a rich bar when interactive, one plain line per logged
step otherwise, so pod logs and Pipes stay readable)."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path
from typing import Any

from fm_pipeline.rundir.records import METRICS_FILE, RANK_TIMINGS_FILE, SEGMENTS_FILE, JsonLines
from fm_pipeline.train.tracking import MlflowSink, PipesSink, TrainerTracking, pipes_requested

log = logging.getLogger(__name__)


class SegmentReporter:
    def __init__(self, *, job_name: str, runs_dir: Path, params: dict[str, Any],
                 start_step: int, target_step: int, tracking: TrainerTracking | None = None):
        self.segment = f"{start_step:08d}-{uuid.uuid4().hex[:8]}"
        common = {"job": job_name, "segment": self.segment}
        self.metrics = JsonLines(runs_dir / METRICS_FILE, **common)
        self.timings = JsonLines(runs_dir / RANK_TIMINGS_FILE, **common)
        self.segments = JsonLines(runs_dir / SEGMENTS_FILE, **common)
        self.mlflow: MlflowSink | None = None
        self.pipes: PipesSink | None = None
        if tracking is not None and tracking.uri:  # opens in the background; unusable: a
            # warning, never an error
            self.mlflow = MlflowSink(tracking, job_name=job_name, params=params,
                                     run_name=f"{job_name}-steps-{start_step}-{target_step}")
        if pipes_requested():
            self.pipes = PipesSink()
        self._progress = None
        self._task = None
        if sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                      TimeRemainingColumn())
            self._progress.start()
            self._task = self._progress.add_task(
                f"{job_name} steps {start_step}->{target_step}",
                total=target_step - start_step, info="")
        self.message(f"segment {self.segment}: steps {start_step} -> {target_step}")

    def message(self, text: str) -> None:
        log.info(text)
        if self._progress is None:
            print(text, flush=True)
        if self.pipes is not None:
            self.pipes.log(text)

    def step(self, record: dict[str, Any]) -> None:
        self.metrics.write("step", **record)
        if self.mlflow is not None:
            self.mlflow.log_metrics(record["step"], {
                k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))})
        mfu = record.get("mfu")
        info = (f"loss {record['loss']:.4f}  {record['tokens_per_s']:.0f} tok/s"
                + (f"  mfu {100 * mfu:.1f}%" if mfu is not None else ""))
        if self._progress is not None:
            self._progress.update(self._task, advance=record.get("advance", 1), info=info)
        else:
            print(f"step {record['step']}: {info}  grad_norm {record['grad_norm']:.3f}  "
                  f"lr {record['lr']:.2e}  step {record['step_time_s']:.3f}s", flush=True)

    def advance(self, n: int) -> None:
        """Steps that were trained but not logged (log_every > 1)."""
        if self._progress is not None and n:
            self._progress.update(self._task, advance=n)

    def rank_timings(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self.timings.write("rank_timing", **r)

    def close(self, summary: dict[str, Any], *, error: BaseException | None = None) -> None:
        if self._progress is not None:
            self._progress.stop()
        self.segments.write("segment", **summary)
        self.message(
            f"segment {self.segment} {summary['exit_reason']} at step {summary['end_step']}"
            + (f": loss {summary['final_loss']:.4f}" if summary.get("final_loss") else ""))
        try:
            if self.mlflow is not None:
                self.mlflow.close(summary=summary, failed=error is not None)
        finally:
            if self.pipes is not None:
                self.pipes.close(summary=summary, error=error)
            for f in (self.metrics, self.timings, self.segments):
                f.close()
