"""What both launcher resources hand back: a SegmentRun, or a dagster.Failure saying why.

A failed segment raises `dagster.Failure` whose metadata carries the real outcome
(`outcome`: succeeded/preempted/bad_config/failed/killed/timed_out, `exit_code`,
`failed_rank`, `reason`, `segment_dir`), so run-failure sensors read it from the step's
failure event instead of parsing text; `allow_retries` is False for a bad config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster import AssetCheckResult, Failure, MaterializeResult, PipesClientCompletedInvocation

from fm_pipeline.launch.outcome import Outcome, SegmentResult


@dataclass(frozen=True)
class SegmentRun:
    """A segment that reached its end step, with what rank 0 reported through Pipes."""

    result: SegmentResult
    pipes: PipesClientCompletedInvocation

    def get_results(self) -> list:
        """Rank 0's reported results (MaterializeResult / AssetCheckResult). A segment that a
        JobSet restarted reports again from the new pod: the last report of each asset and
        check is the one that counts."""
        latest: dict[tuple, Any] = {}
        for reported in self.pipes.get_results():
            key = (type(reported).__name__, reported.asset_key,
                   getattr(reported, "check_name", None))
            latest.pop(key, None)
            latest[key] = reported
        return list(latest.values())

    def metadata(self) -> dict[str, Any]:
        return result_metadata(self.result)

    def materialize_result(self) -> MaterializeResult:
        """Rank 0's materialization of the one asset (or an implicit one) with its checks,
        plus the launcher's metadata (outcome, exit code, duration, segment directory)."""
        results = self.get_results()
        materializations = [r for r in results if isinstance(r, MaterializeResult)]
        checks = [r for r in results if isinstance(r, AssetCheckResult)]
        if len(materializations) > 1:
            keys = ", ".join(str(m.asset_key) for m in materializations)
            raise ValueError(f"rank 0 reported several assets ({keys}): use get_results()")
        reported = materializations[0] if materializations else MaterializeResult()
        return MaterializeResult(
            asset_key=reported.asset_key,
            metadata={**(reported.metadata or {}), **self.metadata()},
            check_results=[*(reported.check_results or []), *checks],
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
        allow_retries=result.outcome not in (Outcome.BAD_CONFIG, Outcome.LEASE_HELD),
    )
