"""MLflow tracking without Dagster: one parent run per training job, a child run per
segment, evaluation and restore drill, found by fm.* tags from any process.

    from fm_pipeline.tracking import JobTracker
    tracker = JobTracker(site.tracking_uri)   # config.site: sqlite under the site's home
    run_id = tracker.start_segment_run(job, segment="to-40", end_step=40)
    env = tracker.trainer_env(run_id)         # FM_MLFLOW_URI / FM_MLFLOW_RUN_ID / ...

Modules: names (env vars, tags, run names), params (job spec and plan as params, secrets
dropped), runs (find/create runs by tags over an MlflowClient), tracker (JobTracker).
Importing this package does not import mlflow (~2 s); the first MLflow call does.
docs/tracking.md describes the run model.
"""

from fm_pipeline.tracking.names import (
    ENV_EXPERIMENT,
    ENV_PARENT_RUN_ID,
    ENV_RUN_ID,
    ENV_URI,
)
from fm_pipeline.tracking.params import flatten_params, is_secret_key
from fm_pipeline.tracking.tracker import JobTracker

__all__ = ["ENV_EXPERIMENT", "ENV_PARENT_RUN_ID", "ENV_RUN_ID", "ENV_URI", "JobTracker",
           "flatten_params", "is_secret_key"]
