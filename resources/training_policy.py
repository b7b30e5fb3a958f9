"""How the training sensors resume failed segments, as a Dagster resource.

    resources={"training_policy": TrainingPolicyResource()}          # 3 in a row, 30 s backoff
    TrainingPolicyResource(backoff_base_s=2, max_consecutive_failures=2)   # the demo's

The rules themselves live in fm_pipeline.orchestration.retry (RetryPolicy).
"""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from fm_pipeline.orchestration import RetryPolicy


class TrainingPolicyResource(ConfigurableResource):
    max_consecutive_failures: int = Field(
        default=3, ge=0, description="failures without a successful segment in between")
    max_failures: int = Field(default=10, ge=0, description="failures in the job's life")
    backoff_base_s: float = Field(default=30.0, ge=0,
                                  description="wait before the first resume; doubles after")
    backoff_max_s: float = Field(default=900.0, ge=0, description="longest wait")
    crash_loop_repeats: int = Field(
        default=2, ge=2, description="the same failure at the same step this often: stop")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> TrainingPolicyResource:
        """The defaults, except FM_RETRY_BACKOFF_S (the first resume's wait; fm demo sets 3):
        a daemon's resources come from the environment it was started with."""
        import os

        env = os.environ if env is None else env
        backoff = env.get("FM_RETRY_BACKOFF_S")
        return cls(backoff_base_s=float(backoff)) if backoff else cls()

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(max_consecutive_failures=self.max_consecutive_failures,
                           max_failures=self.max_failures, backoff_base_s=self.backoff_base_s,
                           backoff_max_s=max(self.backoff_max_s, self.backoff_base_s),
                           crash_loop_repeats=self.crash_loop_repeats)
