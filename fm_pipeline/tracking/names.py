"""The MLflow vocabulary every process shares: environment variables, tag keys, run kinds
and run names. The orchestrator, the trainer's rank 0 and `make mlflow-ui` users all find
runs by these tags, so they are defined once, here.

    FM_MLFLOW_URI            tracking URI (http://host:port or sqlite:///...); rank 0
                             reports to MLflow only when it (or MLFLOW_TRACKING_URI) is set
    FM_MLFLOW_EXPERIMENT     experiment name (default "fm-pipeline")
    FM_MLFLOW_PARENT_RUN_ID  the training job's parent run: rank 0 creates its segment run
                             under it
    FM_MLFLOW_RUN_ID         the segment run the orchestrator created: rank 0 logs into it
                             and leaves ending it to the orchestrator
    FM_MLFLOW_UI_URL         an MLflow UI serving the store (`make ui` sets the one of
                             `make mlflow-ui`): Dagster metadata links runs to it
"""

from __future__ import annotations

ENV_URI = "FM_MLFLOW_URI"
ENV_EXPERIMENT = "FM_MLFLOW_EXPERIMENT"
ENV_PARENT_RUN_ID = "FM_MLFLOW_PARENT_RUN_ID"
ENV_RUN_ID = "FM_MLFLOW_RUN_ID"
ENV_UI_URL = "FM_MLFLOW_UI_URL"

DEFAULT_EXPERIMENT = "fm-pipeline"

# Tags (MLflow's own parent tag makes the UI nest child runs under the job's run).
TAG_PARENT = "mlflow.parentRunId"
TAG_KIND = "fm.kind"
TAG_JOB = "fm.job"
TAG_TENANT = "fm.tenant"
TAG_OWNER = "fm.owner"
TAG_PRIORITY = "fm.priority"
TAG_SEGMENT = "fm.segment"
TAG_START_STEP = "fm.start_step"
TAG_END_STEP = "fm.end_step"
TAG_CHECKPOINT_STEP = "fm.checkpoint_step"
TAG_CHECKPOINT_URI = "fm.checkpoint_uri"
TAG_DAGSTER_RUN = "dagster.run_id"
TAG_OUTCOME = "fm.outcome"
TAG_FAILURE = "fm.failure_reason"
TAG_REDACTED = "fm.redacted_params"
TAG_DRILL_PASSED = "fm.drill_passed"
TAG_EXCLUSION = "fm.straggler_exclusion"  # segment run: the exclusion its launch applied
TAG_COPIED_MS = "fm.parent_copied_ms"  # segment run: its metrics up to here are on the parent
CHECKPOINT_TAG_PREFIX = "fm.checkpoint."  # parent run: one tag per checkpoint step -> URI

# Values of TAG_KIND.
KIND_JOB = "job"
KIND_SEGMENT = "segment"
KIND_EVALUATION = "evaluation"
KIND_DRILL = "drill"
KINDS = (KIND_JOB, KIND_SEGMENT, KIND_EVALUATION, KIND_DRILL)


def segment_run_name(job_name: str, *, start_step: int | None, end_step: int) -> str:
    """"demo-steps-20-40"; "demo-to-40" while the start step is unknown (the trainer picks
    the newest valid checkpoint itself)."""
    if start_step is None:
        return f"{job_name}-to-{end_step}"
    return f"{job_name}-steps-{start_step}-{end_step}"


def evaluation_run_name(job_name: str, checkpoint_step: int) -> str:
    return f"{job_name}-eval-step-{checkpoint_step}"


def drill_run_name(job_name: str, checkpoint_step: int) -> str:
    return f"{job_name}-drill-step-{checkpoint_step}"


def checkpoint_tag(step: int) -> str:
    """The parent run's tag for one checkpoint: "fm.checkpoint.00000020" (sorts by step)."""
    return f"{CHECKPOINT_TAG_PREFIX}{step:08d}"
