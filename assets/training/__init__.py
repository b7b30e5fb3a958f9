"""The training area's Dagster definitions: a training job's segments, checkpoints,
evaluations and restore drills as partitions of one lineage, and the sensors and schedule
that carry a job from its first segment to its target step.

    data_mix -> training_plan -> training_segment -> checkpoint -> evaluation
                                                                 -> restore_drill

    dagster dev -w workspace.yaml        # group "training", partitions "training_jobs"
    fm demo                              # the whole pipeline, driven by these sensors

Modules: plan / segment / checkpoints / evaluation / drills (assets and checks), jobs,
sensors (intake, failure, progress, evaluation), schedules. What they share about a job's
runs (names and tags, run requests, history read from the instance, the REST API's
orchestrator) is fm_pipeline.dagster_runs. Every run is started by the
Dagster daemon (its sensors and schedule, the run queue); docs/orchestration.md explains it.
Resources: "launcher" (launcher_from_env: local torchrun, or Kubernetes), "mlflow",
"training_policy"; "store" comes from the data area's definitions.
"""

from __future__ import annotations

from dagster import Definitions
from fm_pipeline.assets.training.checkpoints import checkpoint, checkpoint_valid
from fm_pipeline.assets.training.drills import restore_drill
from fm_pipeline.assets.training.evaluation import evaluation
from fm_pipeline.assets.training.jobs import TRAINING_JOBS
from fm_pipeline.assets.training.plan import training_plan
from fm_pipeline.assets.training.schedules import restore_drill_schedule
from fm_pipeline.assets.training.segment import training_segment
from fm_pipeline.assets.training.sensors import TRAINING_SENSORS
from fm_pipeline.resources.launcher import launcher_from_env
from fm_pipeline.resources.mlflow import MlflowTrackingResource
from fm_pipeline.resources.training_policy import TrainingPolicyResource

TRAINING_ASSETS = [training_plan, training_segment, checkpoint, evaluation, restore_drill]

defs = Definitions(
    assets=TRAINING_ASSETS,
    asset_checks=[checkpoint_valid],
    jobs=TRAINING_JOBS,
    sensors=TRAINING_SENSORS,
    schedules=[restore_drill_schedule],
    resources={"launcher": launcher_from_env(), "mlflow": MlflowTrackingResource(),
               "training_policy": TrainingPolicyResource.from_env()},
)
