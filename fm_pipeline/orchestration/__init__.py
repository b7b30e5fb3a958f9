"""The orchestration layer's decisions and bookkeeping, without Dagster: which segment comes
next, whether and when a failed one is resumed, where each training job's spec lives, and
what a finished segment measured against its plan.

    from fm_pipeline.orchestration import RetryPolicy, decide_after_failure, plan_segment
    from fm_pipeline.orchestration import register_job, registered_job, segment_report

The Dagster assets, sensors and schedules (fm_pipeline.assets.training) call these.
"""

from fm_pipeline.orchestration.goodput import job_goodput, segment_report
from fm_pipeline.orchestration.registry import (
    UnknownJob,
    register_job,
    registered_job,
    registered_jobs,
)
from fm_pipeline.orchestration.retry import (
    Decision,
    RetryPolicy,
    SegmentAttempt,
    decide_after_failure,
    failures_in_a_row,
)
from fm_pipeline.orchestration.segments import SegmentNotRunnable, SegmentPlan, plan_segment

__all__ = ["Decision", "RetryPolicy", "SegmentAttempt", "UnknownJob", "decide_after_failure",
           "failures_in_a_row", "job_goodput", "plan_segment", "register_job",
           "registered_job", "registered_jobs", "segment_report", "SegmentNotRunnable",
           "SegmentPlan"]
