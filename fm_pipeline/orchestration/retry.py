"""What to do after a training segment fails: resume (now or after a backoff), or stop and
say why. Pure decisions over the job's attempts; the Dagster sensors
(fm_pipeline.assets.training.sensors) and the local orchestrator act on them. Where the
next segment starts and ends is orchestration.segments.plan_segment's answer.

    policy = RetryPolicy(max_consecutive_failures=3, backoff_base_s=30)
    decision = decide_after_failure(failed, earlier=attempts, policy=policy)
    decision.action, decision.not_before, decision.reason   # "resume", t + 60 s, "..."

Rules, in order:
  preempted    resume at once from the checkpoint it saved; never counted as a failure
  lease_held   stop this line: a duplicate launch (exit code 3); the live segment goes on
  bad_config   stop: retrying cannot fix it (exit code 2, a spec or data problem)
  crash loop   stop when the same failure (same reason, same step) has now happened
               `crash_loop_repeats` times
  budget       stop after `max_consecutive_failures` failures without a successful segment
               in between, or `max_failures` in the job's life
  otherwise    resume from the newest valid checkpoint after backoff_base_s x 2^(n-1)
               (n = failures in a row), at most backoff_max_s
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SUCCEEDED, PREEMPTED, BAD_CONFIG = "succeeded", "preempted", "bad_config"
LEASE_HELD = "lease_held"  # a duplicate launch: the live segment decides what comes next
_VOLATILE = re.compile(r"0x[0-9a-fA-F]+|\b\d{4,}\b|/tmp/\S+")


@dataclass(frozen=True)
class RetryPolicy:
    max_consecutive_failures: int = 3
    max_failures: int = 10
    backoff_base_s: float = 30.0
    backoff_max_s: float = 900.0
    crash_loop_repeats: int = 2

    def __post_init__(self):
        if self.max_consecutive_failures < 0 or self.max_failures < 0:
            raise ValueError("failure budgets must be >= 0")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError(f"need 0 <= backoff_base_s ({self.backoff_base_s}) <= "
                             f"backoff_max_s ({self.backoff_max_s})")
        if self.crash_loop_repeats < 2:
            raise ValueError(f"crash_loop_repeats must be >= 2, got {self.crash_loop_repeats}")

    @classmethod
    def first_backoff(cls, seconds: float) -> RetryPolicy:
        """The defaults with the first resume's wait set (FM_RETRY_BACKOFF_S; fm demo sets
        3), the cap raised to it when it is longer."""
        return cls(backoff_base_s=seconds, backoff_max_s=max(cls.backoff_max_s, seconds))

    def backoff_s(self, failures_in_a_row: int) -> float:
        if failures_in_a_row < 1:
            return 0.0
        return min(self.backoff_max_s, self.backoff_base_s * 2 ** (failures_in_a_row - 1))


@dataclass(frozen=True)
class SegmentAttempt:
    """One launch of a segment, as the orchestrator recorded its end."""

    run_id: str
    outcome: str  # fm_pipeline.launch.outcome.Outcome values, or "cancelled"/"unknown"
    ended_at: float  # Unix seconds
    reason: str = ""
    exit_code: int | None = None
    failed_at_step: int | None = None  # last step the trainer logged before it ended
    start_step: int | None = None
    end_step: int | None = None
    wall_s: float | None = None  # the launch's wall time (start-up to exit)
    step_time_s: float | None = None  # steady step time measured (successful segments)

    @property
    def failed(self) -> bool:  # a duplicate launch is not the job's failure
        return self.outcome not in (SUCCEEDED, PREEMPTED, LEASE_HELD)

    @property
    def failure_key(self) -> str:
        """The reason without what differs between two occurrences of the same failure
        (process ids, ports, addresses, temp paths)."""
        first = self.reason.strip().splitlines()[0] if self.reason.strip() else self.outcome
        return f"{self.outcome}/{self.exit_code}/{_VOLATILE.sub('#', first)}"


@dataclass(frozen=True)
class Decision:
    action: Literal["resume", "stop"]
    reason: str
    not_before: float = 0.0  # Unix seconds: resume no earlier than this
    failures_in_a_row: int = 0

    @property
    def resume(self) -> bool:
        return self.action == "resume"


def failures_in_a_row(attempts: Sequence[SegmentAttempt]) -> int:
    """Failures since the last successful segment (preemptions neither count nor reset)."""
    n = 0
    for attempt in sorted(attempts, key=lambda a: a.ended_at, reverse=True):
        if attempt.outcome == SUCCEEDED:
            break
        n += attempt.failed
    return n


def decide_after_failure(failed: SegmentAttempt, *, earlier: Sequence[SegmentAttempt],
                         policy: RetryPolicy) -> Decision:
    """Resume (when) or stop (why) after `failed`; `earlier`: the job's previous attempts."""
    earlier = [a for a in earlier if a.run_id != failed.run_id]
    at = f"at step {failed.failed_at_step}" if failed.failed_at_step is not None else \
        "before its first step"
    if failed.outcome == PREEMPTED:
        return Decision("resume", f"preempted {at}: resume from the checkpoint it saved",
                        not_before=failed.ended_at)
    if failed.outcome == LEASE_HELD:
        return Decision("stop", f"another live segment of the job holds its lease; this "
                                f"launch did nothing and the live one carries on: "
                                f"{failed.reason}")
    if failed.outcome == BAD_CONFIG:
        return Decision("stop", f"bad config (exit code {failed.exit_code}): retrying cannot "
                                f"fix it: {failed.reason}")
    same = [a for a in earlier if a.failed and a.failure_key == failed.failure_key
            and a.failed_at_step == failed.failed_at_step]
    if len(same) + 1 >= policy.crash_loop_repeats:
        return Decision("stop", f"crash loop: the same failure {at} "
                                f"{len(same) + 1} times: {failed.reason}")
    in_a_row = failures_in_a_row([*earlier, failed])
    if in_a_row > policy.max_consecutive_failures:
        return Decision("stop", f"retry budget spent: {in_a_row} failures in a row (budget "
                                f"{policy.max_consecutive_failures}); last: {failed.reason}",
                        failures_in_a_row=in_a_row)
    total = sum(a.failed for a in earlier) + 1
    if total > policy.max_failures:
        return Decision("stop", f"retry budget spent: {total} failures in the job's life "
                                f"(budget {policy.max_failures}); last: {failed.reason}",
                        failures_in_a_row=in_a_row)
    wait = policy.backoff_s(in_a_row)
    return Decision("resume", f"failure {in_a_row} in a row ({at}): resume from the newest "
                              f"valid checkpoint after {wait:.0f} s",
                    not_before=failed.ended_at + wait, failures_in_a_row=in_a_row)
