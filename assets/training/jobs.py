"""The training layer's jobs, all partitioned by training job (names.training_jobs).

    training_segment_job        one segment: training_plan (the job's, planned once) ->
                                training_segment -> checkpoint (+ checkpoint_valid)
    checkpoint_evaluation_job   checkpoint_valid (blocking) -> evaluation of one checkpoint
    restore_drill_job           restore_drill (+ restore_drill_passed) of one checkpoint
"""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job, in_process_executor
from fm_pipeline.assets.training.checkpoints import checkpoint, checkpoint_valid
from fm_pipeline.assets.training.drills import restore_drill
from fm_pipeline.assets.training.evaluation import evaluation
from fm_pipeline.dagster_runs.names import DRILL_JOB, EVALUATION_JOB, SEGMENT_JOB, training_jobs
from fm_pipeline.assets.training.plan import training_plan
from fm_pipeline.assets.training.segment import training_segment

# In process: one run worker per run (no process per step), so the run worker's health is
# the segment's, and a run costs one interpreter start-up.
training_segment_job = define_asset_job(
    SEGMENT_JOB, partitions_def=training_jobs, executor_def=in_process_executor,
    selection=AssetSelection.assets(training_plan, training_segment, checkpoint)
    | AssetSelection.checks(checkpoint_valid),
    description="Train one segment of the partition's job and record its checkpoints.")

checkpoint_evaluation_job = define_asset_job(
    EVALUATION_JOB, partitions_def=training_jobs, executor_def=in_process_executor,
    selection=AssetSelection.assets(evaluation) | AssetSelection.checks(checkpoint_valid),
    description="Validate one checkpoint (blocking) and evaluate it per data domain.")

restore_drill_job = define_asset_job(
    DRILL_JOB, partitions_def=training_jobs, executor_def=in_process_executor,
    selection=AssetSelection.assets(restore_drill),
    description="Restore one checkpoint on another topology and verify it.")

TRAINING_JOBS = [training_segment_job, checkpoint_evaluation_job, restore_drill_job]
