"""The training partitions and the run tags every part of the training layer agrees on.

One dynamic partition per training job (key = the job's name): every training asset
(`training_segment`, `checkpoint`, `evaluation`, `restore_drill`) is partitioned by it, so a
job's segments, checkpoints, evaluations and drills are the materialization history of its
partition (docs/orchestration.md says why).

Tags on segment runs (set by whoever requests them: the intake and the other sensors):
    fm/job, fm/segment_of (the instance's run queue admits one per value), fm/trigger (submit | next_segment | resume_after_failure |
    resume_after_preemption), fm/start_step, fm/end_step, fm/resumes_run, fm/resume_from,
    fm/tenant, fm/priority
Tags of runs the REST API started (orchestrator.py), carried by the sensors to every
segment that follows: fm/api_job_id, fm/api_run (the API run's sequence number, 1, 2, ...);
fm/stop (preempt | cancel) marks a run the control plane stopped: the sensors neither
resume it nor start its next segment (the control plane decides when the job resumes).
Tags the failure sensor adds to a failed segment run (the decision, visible in the UI):
    fm/outcome, fm/exit_code, fm/failed_at_step, fm/failure, fm/decision (resumed |
    resume_pending | stopped), fm/decision_reason, fm/resume_at (Unix seconds)
Tags on evaluation and drill runs: fm/checkpoint_step (which checkpoint; default the newest).
"""

from dagster import DynamicPartitionsDefinition

from fm_pipeline.deploy.instance import JOB_TAG, SEGMENT_OF_TAG

GROUP = "training"
JOBS_PARTITION = "training_jobs"
training_jobs = DynamicPartitionsDefinition(name=JOBS_PARTITION)

PARTITION_TAG = "dagster/partition"
TAG_JOB = JOB_TAG
TAG_SEGMENT_OF = SEGMENT_OF_TAG  # segment runs only: the instance runs one per job at a time
TAG_TRIGGER = "fm/trigger"
TAG_START = "fm/start_step"
TAG_END = "fm/end_step"
TAG_RESUMES = "fm/resumes_run"
TAG_RESUME_FROM = "fm/resume_from"
TAG_TENANT = "fm/tenant"
TAG_PRIORITY = "fm/priority"
TAG_API_JOB = "fm/api_job_id"
TAG_API_RUN = "fm/api_run"
TAG_STOP = "fm/stop"
# Tags a sensor copies from the run it follows onto the segment it requests.
CARRIED_TAGS = (TAG_API_JOB, TAG_API_RUN)

TAG_OUTCOME = "fm/outcome"
TAG_EXIT_CODE = "fm/exit_code"
TAG_FAILED_AT = "fm/failed_at_step"
TAG_FAILURE = "fm/failure"
TAG_DECISION = "fm/decision"
TAG_DECISION_REASON = "fm/decision_reason"
TAG_RESUME_AT = "fm/resume_at"

TAG_OUTCOME_REASON = "fm/outcome_reason"  # a terminated segment's result, in one line
TAG_CHECKPOINT_STEP = "fm/checkpoint_step"  # the checkpoint (the newest of them) a run is about
TAG_CHECKPOINT_STEPS = "fm/checkpoint_steps"  # "10,20": every checkpoint an evaluation run scores


def checkpoint_steps_of(tags) -> list[int]:
    """The checkpoint steps an evaluation or drill run is about, from its tags ([]: none)."""
    if tags.get(TAG_CHECKPOINT_STEPS):
        return sorted(int(s) for s in tags[TAG_CHECKPOINT_STEPS].split(","))
    return [int(tags[TAG_CHECKPOINT_STEP])] if tags.get(TAG_CHECKPOINT_STEP) else []
RUN_KEY_TAG = "dagster/run_key"  # Dagster's own: the run key a sensor's request carried

RESUMED, RESUME_PENDING, STOPPED = "resumed", "resume_pending", "stopped"


def short(text: str, limit: int = 400) -> str:
    """A tag value: one line, bounded (Dagster shows tags in tables)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."

SEGMENT_JOB = "training_segment_job"
EVALUATION_JOB = "checkpoint_evaluation_job"
DRILL_JOB = "restore_drill_job"
