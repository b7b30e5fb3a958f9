"""LocalLauncher: training segments as torchrun processes on this machine, under Dagster Pipes.

    @asset
    def segment(context, launcher: LocalLauncher):
        run = launcher.launch_segment(context, job=job, end_step=20)
        return run.get_results()   # what rank 0 reported through Pipes

It opens the Pipes session itself (temp-file context and messages; every rank inherits
them, only global rank 0 opens Pipes) and runs the core launcher
(fm_pipeline.launch.local), rather than PipesSubprocessClient: that client either
inherits torchrun's output (and it cannot be read back) or pipes it without reading it
(and a chatty run blocks), while the failure summary in that output is the only record of
a worker killed by a signal. Cancelling the run sends torchrun SIGTERM: ranks checkpoint
and exit as preempted before the step stops. `stop_segments(job, reason=...)`, from any
process of this machine, touches the running segments' preemption flags instead.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from dagster import (
    PipesClientCompletedInvocation,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from fm_pipeline.resources.launcher_results import SegmentRun, segment_failure
from fm_pipeline.resources.segment_launcher import SegmentLauncher
from pydantic import Field

from fm_pipeline.launch.local import preempt_running_segments, run_segment_locally
from fm_pipeline.launch.pod import Placement
from fm_pipeline.launch.spec import SegmentLaunch


class LocalLauncher(SegmentLauncher):
    """Runs each segment as `torchrun --standalone` with every rank of the job on this machine."""

    echo_output: bool = Field(default=True, description="copy torchrun's output to the step log")
    max_restarts: int | None = Field(
        default=None, ge=0,
        description="torchrun restarts within a segment (unset: the job's "
                    "resilience.inplace_restarts)")

    def segment_launch(self, job, **kwargs) -> SegmentLaunch:
        launch = super().segment_launch(job, **kwargs)
        if self.max_restarts is None:
            return launch
        return replace(launch, max_restarts=self.max_restarts)

    def run_launch(self, context, launch: SegmentLaunch, *, extras: dict, placement: Placement,
                   env: dict) -> SegmentRun:
        with open_pipes_session(
            context=context,
            context_injector=PipesTempFileContextInjector(),
            message_reader=PipesTempFileMessageReader(),
            extras=extras,
        ) as session:
            result = run_segment_locally(
                launch, site=self.site(), env={**env, **session.get_bootstrap_env_vars()},
                timeout_s=self.timeout_s,
                echo=sys.stdout if self.echo_output else None,
            )
        context.log.info(f"segment {launch.job.name} -> step {launch.end_step}: "
                         f"{result.outcome.value} in {result.duration_s:.1f} s "
                         f"({result.segment_dir})")
        if not result.ok:
            raise segment_failure(result)
        return SegmentRun(result=result, pipes=PipesClientCompletedInvocation(session))

    def stop_segments(self, job_name: str, *, reason: str) -> list[str]:
        """Ask the job's running segments to checkpoint and exit 75 (their preemption flag;
        `reason` is for the caller's log). The trainer ignores a flag older than itself:
        a caller that may be early (a segment still starting) repeats this until the end."""
        return [str(d) for d in preempt_running_segments(self.site().runs_dir(job_name))]
