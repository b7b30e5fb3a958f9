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
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    ConfigurableResource,
    PipesClientCompletedInvocation,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from fm_pipeline.resources.launcher_results import SegmentRun, segment_failure
from pydantic import Field

from fm_pipeline.config import JobSpec
from fm_pipeline.launch.local import preempt_running_segments, run_segment_locally
from fm_pipeline.launch.pod import Placement
from fm_pipeline.launch.spec import TRAINER_MODULE, SegmentLaunch


class LocalLauncher(ConfigurableResource):
    """Runs each segment as `torchrun --standalone` with every rank of the job on this machine."""

    trainer_module: str = Field(default=TRAINER_MODULE, description="module torchrun runs (-m)")
    timeout_s: float | None = Field(default=None, description="stop a segment after this long")
    echo_output: bool = Field(default=True, description="copy torchrun's output to the step log")
    max_restarts: int = Field(default=0, ge=0, description="torchrun restarts within a segment")

    def launch_segment(
        self,
        context,
        *,
        job: JobSpec,
        end_step: int,
        overrides: Sequence[str] = (),
        extras: Mapping[str, Any] | None = None,
        placement: Placement | None = None,
        env: Mapping[str, str] | None = None,
        resume_from: str | None = None,
    ) -> SegmentRun:
        """Train `job` up to `end_step`; raises dagster.Failure (metadata: outcome, exit_code,
        failed_rank, reason) unless the segment reached its end step. `placement` is
        accepted for the same call as KubernetesLauncher; one machine has nothing to place.
        `env` is added to every worker's environment (e.g. the MLflow run to log into);
        `resume_from` (a checkpoint directory or store location) replaces the newest valid."""
        launch = SegmentLaunch(job, end_step=end_step, module=self.trainer_module,
                               overrides=tuple(overrides), max_restarts=self.max_restarts,
                               resume_from=resume_from)
        with open_pipes_session(
            context=context,
            context_injector=PipesTempFileContextInjector(),
            message_reader=PipesTempFileMessageReader(),
            extras=dict(extras or {}),
        ) as session:
            result = run_segment_locally(
                launch, env={**dict(env or {}), **session.get_bootstrap_env_vars()},
                timeout_s=self.timeout_s,
                echo=sys.stdout if self.echo_output else None,
            )
        context.log.info(f"segment {job.name} -> step {end_step}: {result.outcome.value} "
                         f"in {result.duration_s:.1f} s ({result.segment_dir})")
        if not result.ok:
            raise segment_failure(result)
        return SegmentRun(result=result, pipes=PipesClientCompletedInvocation(session))

    def stop_segments(self, job_name: str, *, reason: str) -> list[str]:
        """Ask the job's running segments to checkpoint and exit 75 (their preemption flag;
        `reason` is for the caller's log). The trainer ignores a flag older than itself:
        a caller that may be early (a segment still starting) repeats this until the end."""
        return [str(d) for d in preempt_running_segments(job_name)]
