"""`restore_drill`: restore one checkpoint on a different topology than it was written with
and verify it (parameters, optimizer state, probe loss, data cursor, checksums).

The drill schedule (schedules.py) requests it for the newest checkpoint of every job whose
newest checkpoint has not been drilled; the UI can materialize it for the newest one. The
drill uses the object store's copy (the one a disaster recovery would use); the verdict is
the `restore_drill_passed` check, the checkpoint's `drill` mark and an MLflow child run.
"""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    asset,
)
from fm_pipeline.assets.training.checkpoints import checkpoint, checkpoint_for_run
from fm_pipeline.dagster_runs.names import GROUP, training_jobs
from fm_pipeline.resources.mlflow import MlflowTrackingResource
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.orchestration import registered_job

DRILL_CHECK = "restore_drill_passed"


@asset(partitions_def=training_jobs, group_name=GROUP, deps=[checkpoint], kinds={"pytorch"},
       check_specs=[AssetCheckSpec(DRILL_CHECK, asset="restore_drill",
                                   description="The checkpoint restored on another topology "
                                               "with identical parameters, optimizer state, "
                                               "probe loss and data cursor.")])
def restore_drill(context: AssetExecutionContext, store: ObjectStoreResource,
                  mlflow: MlflowTrackingResource) -> MaterializeResult:
    """A restore drill of one checkpoint of the job on a different topology."""
    from fm_pipeline.checkpoint.drill import run_restore_drill
    from fm_pipeline.orchestration.checkpoints import preferred_copy

    target, site = store.open(), store.site()
    job = registered_job(target, context.partition_key)
    step, copies = checkpoint_for_run(context, job.name, target, site=site)
    ref = preferred_copy(copies, tier="store")
    result = run_restore_drill(ref, site=site, job=job, store=target)
    context.log.info(result.summary())
    ml_run = mlflow.log_drill(
        job, checkpoint_step=step, checkpoint_uri=ref.location, passed=result.passed,
        metrics={"restore_s": result.restore_s, "bytes_per_s": result.bytes_per_s,
                 "wall_s": result.wall_s},
        params={"drill": {"source_topology": result.source_topology,
                          "drill_topology": result.drill_topology}},
        dagster_run_id=context.run.run_id, failure_reason="; ".join(result.reasons) or None)
    reasons = MetadataValue.md("\n".join(f"- {r}" for r in result.reasons) or "none")
    metadata = {"checkpoint_step": step, "checkpoint": MetadataValue.path(ref.location),
                "passed": result.passed, "source_topology": result.source_topology,
                "drill_topology": result.drill_topology, "world_size": result.world_size,
                "restore_s": round(result.restore_s, 3),
                "bytes_per_s": round(result.bytes_per_s, 1), "wall_s": round(result.wall_s, 3),
                "reasons": reasons, "mlflow_run_id": ml_run}
    if url := mlflow.run_url(ml_run):
        metadata["mlflow"] = MetadataValue.url(url)
    return MaterializeResult(metadata=metadata, check_results=[AssetCheckResult(
        check_name=DRILL_CHECK, passed=result.passed, severity=AssetCheckSeverity.ERROR,
        metadata={"checkpoint_step": step, "reasons": reasons},
        description=result.summary().splitlines()[0])])
