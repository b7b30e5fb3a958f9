"""Following a training job's runs as the Dagster daemon starts them: one progress row per
run (live step and loss for segments), and waiting until the job is done.

    follower = RunFollower(progress, instance, job_name, target_step=60)
    run = follower.wait_for_key("data_mix-demo-1-1")      # that run, once finished
    follower.wait_for_target(api_run=1)                    # the job's run 1 ended
    runs = follower.wait_until_idle(api_run=1)             # ... and nothing more is due

Nothing is executed here: fm demo submits (orchestration.submissions) and watches the
instance's run records, the files the trainer writes and the sensors' decisions.
"""

from __future__ import annotations

import time

from dagster import DagsterRunStatus, RunsFilter
from rich.progress import Progress

from fm_pipeline.dagster_runs.api_jobs import api_run_records, run_info
from fm_pipeline.assets.training.checkpoints import recorded_checkpoints
from fm_pipeline.dagster_runs.names import (
    EVALUATION_JOB,
    RUN_KEY_TAG,
    SEGMENT_JOB,
    TAG_END,
    TAG_JOB,
    TAG_START,
    TAG_TRIGGER,
    checkpoint_steps_of,
)

FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
POLL_S = 0.5


class JobStopped(RuntimeError):
    """The job's run ended without reaching its target (the reason is the message)."""


class RunFollower:
    def __init__(self, progress: Progress, instance, job_name: str, *, target_step: int):
        self.progress, self.instance = progress, instance
        self.job_name, self.target_step = job_name, target_step
        self.rows: dict[str, int] = {}
        self.started: dict[str, float] = {}
        self.finished: set[str] = set()

    # -- rows --------------------------------------------------------------------------

    def _records(self) -> list:
        return list(self.instance.get_run_records(
            filters=RunsFilter(tags={TAG_JOB: self.job_name}), ascending=True))

    def refresh(self) -> list:
        """Update every run's row; returns the job's run records, oldest first."""
        records = self._records()
        for record in records:
            run = record.dagster_run
            if run.run_id not in self.rows:
                self.rows[run.run_id] = self.progress.add_task(_label(run), total=1,
                                                               note="queued")
                self.started[run.run_id] = record.create_timestamp.timestamp()
            if run.run_id in self.finished:
                continue
            task = self.rows[run.run_id]
            if run.status in FINISHED:
                self.progress.update(task, completed=1, note=self._outcome(run))
                self.progress.stop_task(task)
                self.finished.add(run.run_id)
            elif run.status == DagsterRunStatus.STARTED:
                self.progress.update(task, note=self._running(run))
            else:
                self.progress.update(task, note=run.status.value.lower())
        return records

    def _running(self, run) -> str:
        if run.job_name != SEGMENT_JOB:
            return "running"
        from fm_pipeline.api.progress import latest_metrics

        m = latest_metrics(self.job_name)
        if not m or m.get("time", 0) < self.started[run.run_id]:
            return "starting torchrun"
        mfu = f"  mfu {100 * m['mfu']:.1f}%" if m.get("mfu") else ""
        return f"step {m['step']}/{run.tags.get(TAG_END)}  loss {m['loss']:.3f}{mfu}"

    def _outcome(self, run) -> str:
        if run.status == DagsterRunStatus.SUCCESS:
            return "[green]done[/]"
        if run.status == DagsterRunStatus.CANCELED:
            return "[yellow]cancelled[/]"
        from fm_pipeline.dagster_runs.history import step_failure

        _, reason = step_failure(self.instance, run.run_id)
        return f"[red]failed:[/] {reason.splitlines()[0][:110]}"

    # -- waiting -----------------------------------------------------------------------

    def wait_for_key(self, run_key: str, *, timeout_s: float = 1800):
        """The run the daemon started for `run_key`, once it finished."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.refresh()
            runs = self.instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: run_key}),
                                          limit=1)
            if runs and runs[0].status in FINISHED:
                self.refresh()
                return runs[0]
            time.sleep(POLL_S)
        raise TimeoutError(f"run {run_key} did not finish within {timeout_s:.0f} s (is the "
                           "Dagster daemon running? fm starts one with the demo)")

    def wait_for_target(self, *, api_run: int, timeout_s: float = 3600) -> None:
        """Until the job's run `api_run` has ended; raises JobStopped when it did not reach
        the target. Its evaluations may still be queued or running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.refresh()
            mine = api_run_records(self.instance, self.job_name).get(api_run)
            if mine:
                info = run_info(self.instance, mine, target_step=self.target_step)
                if info.state not in ("starting", "running"):
                    if info.state != "succeeded":
                        raise JobStopped(f"{self.job_name}: {info.state}: {info.reason}")
                    return
            time.sleep(POLL_S)
        raise TimeoutError(f"{self.job_name} did not finish within {timeout_s:.0f} s")

    def wait_until_idle(self, *, api_run: int, timeout_s: float = 3600) -> list:
        """Until the job's run `api_run` has ended (target reached, or stopped) and every
        checkpoint it recorded has its evaluation; raises JobStopped when it did not reach
        the target. Returns the job's run records."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records = self.refresh()
            mine = api_run_records(self.instance, self.job_name).get(api_run)
            if mine:
                info = run_info(self.instance, mine, target_step=self.target_step)
                busy = [r for r in records if r.dagster_run.status not in FINISHED]
                if info.state not in ("starting", "running") and not busy and \
                        self._evaluated(records):
                    if info.state != "succeeded":
                        raise JobStopped(f"{self.job_name}: {info.state}: {info.reason}")
                    return records
            time.sleep(POLL_S)
        raise TimeoutError(f"{self.job_name} did not finish within {timeout_s:.0f} s")

    def _evaluated(self, records) -> bool:
        """Every recorded checkpoint step has a finished evaluation run."""
        steps = {c["step"] for c in recorded_checkpoints(self.instance, self.job_name)}
        done = {step for r in records
                if r.dagster_run.job_name == EVALUATION_JOB and r.dagster_run.status in FINISHED
                for step in checkpoint_steps_of(r.dagster_run.tags)}
        return steps <= done


def _label(run) -> str:
    tags = run.tags
    if run.job_name == SEGMENT_JOB:
        return f"segment {tags.get(TAG_START)}->{tags.get(TAG_END)} [dim]{tags.get(TAG_TRIGGER)}[/]"
    if steps := checkpoint_steps_of(tags):
        verb = "evaluate" if run.job_name == EVALUATION_JOB else "restore drill"
        return f"{verb} step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"
    return run.job_name
