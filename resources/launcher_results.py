"""What both launcher resources hand back: a SegmentRun, or a dagster.Failure saying why.

A failed segment raises `dagster.Failure` whose metadata carries the real outcome
(`outcome`: succeeded/preempted/bad_config/failed/killed/timed_out, `exit_code`,
`failed_rank`, `reason`, `segment_dir`), so run-failure sensors read it from the step's
failure event instead of parsing text; `allow_retries` is False for a bad config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster import Failure, MaterializeResult, PipesClientCompletedInvocation

from fm_pipeline.launch.outcome import Outcome, SegmentResult


@dataclass(frozen=True)
class SegmentRun:
    """A segment that reached its end step, with what rank 0 reported through Pipes."""

    result: SegmentResult
    pipes: PipesClientCompletedInvocation

    def get_results(self):
        """Pipes results (MaterializeResult / AssetCheckResult) reported by rank 0."""
        return self.pipes.get_results()

    def metadata(self) -> dict[str, Any]:
        return result_metadata(self.result)

    def materialize_result(self) -> MaterializeResult:
        """Rank 0's reported materialization (or an empty one), plus the launcher's metadata."""
        reported = self.pipes.get_materialize_result(implicit_materialization=True)
        return MaterializeResult(
            asset_key=reported.asset_key,
            metadata={**(reported.metadata or {}), **self.metadata()},
            check_results=reported.check_results,
            data_version=reported.data_version,
        )


def result_metadata(result: SegmentResult) -> dict[str, Any]:
    data = {
        "outcome": result.outcome.value,
        "exit_code": result.exit_code,
        "end_step": result.end_step,
        "duration_s": result.duration_s,
        "reason": result.reason,
    }
    for key in ("failed_rank", "segment_dir", "evidence"):
        value = getattr(result, key)
        if value is not None:
            data[key] = value
    return data


def segment_failure(result: SegmentResult) -> Failure:
    where = f" on rank {result.failed_rank}" if result.failed_rank is not None else ""
    return Failure(
        description=(
            f"segment {result.job} -> step {result.end_step} {result.outcome.value}{where}: "
            f"exit code {result.exit_code}: {result.reason}"
        ),
        metadata=result_metadata(result),
        allow_retries=result.outcome is not Outcome.BAD_CONFIG,
    )
