"""The Job spec and where a job's state lives."""

from fm_pipeline.config.load import JobSpecError, dump_job, load_job, parse_job, parse_overrides
from fm_pipeline.config.spec import (
    PRIORITY_VALUES,
    CheckpointSpec,
    ClusterSpec,
    DataSpec,
    JobSpec,
    ModelSpec,
    ParallelismSpec,
    ResilienceSpec,
    SourceSpec,
    TrainingSpec,
    compute_dtype,
    fp8_recipe,
)

__all__ = [
    "PRIORITY_VALUES", "CheckpointSpec", "ClusterSpec", "DataSpec", "JobSpec", "JobSpecError",
    "ModelSpec", "ParallelismSpec", "ResilienceSpec", "SourceSpec", "TrainingSpec", "dump_job",
    "compute_dtype", "fp8_recipe", "load_job", "parse_job", "parse_overrides",
]
