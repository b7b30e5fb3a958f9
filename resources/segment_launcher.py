"""The launcher contract, once: what every `launcher` resource (LocalLauncher,
KubernetesLauncher) offers the `training_segment` asset and the control plane.

    run = launcher.launch_segment(context, job=job, end_step=20, env={...},
                                  resume_from=None, placement=None, overrides=(), extras={})
    run.result      # fm_pipeline.launch.SegmentResult: outcome, exit code, reason, duration
    run.get_results() / run.materialize_result()   # what rank 0 reported through Pipes
    launcher.stop_segments("job-1", reason="preempt")   # checkpoint and exit 75, from here

`launch_segment` trains `job` up to `end_step` and raises dagster.Failure (metadata:
outcome, exit_code, failed_rank, reason; fm_pipeline.resources.launcher_results) unless the
segment reached its end step. `env` is added to every worker's environment (e.g. the MLflow
run to log into); `resume_from` (a checkpoint directory or store location the workers can
read) replaces the newest valid checkpoint (`planned`: it is the orchestrator's plan, and
the trainer falls back to the newest valid one when it fails validation); `placement` is where the ranks may run (one
machine has nothing to place). A subclass defines `run_launch(context, launch, *, extras,
placement, env)` for the torchrun invocation `launch` and `stop_segments`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import ConfigurableResource
from fm_pipeline.resources.launcher_results import SegmentRun
from pydantic import Field

from fm_pipeline.config import JobSpec
from fm_pipeline.config.site import Site
from fm_pipeline.launch.pod import Placement
from fm_pipeline.launch.spec import TRAINER_MODULE, SegmentLaunch


class SegmentLauncher(ConfigurableResource):
    trainer_module: str = Field(default=TRAINER_MODULE, description="module torchrun runs (-m)")
    timeout_s: float | None = Field(default=None, description="stop a segment after this long")

    def site(self) -> Site:
        """Where the launched segments keep their state: built here, at the Dagster entry
        point, from the environment of the process that launches them."""
        return Site.from_environ()

    def segment_launch(self, job: JobSpec, *, end_step: int, overrides: Sequence[str],
                       resume_from: str | None, planned: bool = False) -> SegmentLaunch:
        """The torchrun invocation of one segment (the same command locally and in a pod)."""
        return SegmentLaunch(job, end_step=end_step, module=self.trainer_module,
                             overrides=tuple(overrides), resume_from=resume_from,
                             planned=planned)

    def launch_segment(self, context, *, job: JobSpec, end_step: int,
                       overrides: Sequence[str] = (), extras: Mapping[str, Any] | None = None,
                       placement: Placement | None = None, env: Mapping[str, str] | None = None,
                       resume_from: str | None = None, planned: bool = False) -> SegmentRun:
        """See the module docstring."""
        launch = self.segment_launch(job, end_step=end_step, overrides=overrides,
                                     resume_from=resume_from, planned=planned)
        return self.run_launch(context, launch, extras=dict(extras or {}),
                               placement=placement or Placement(), env=dict(env or {}))
