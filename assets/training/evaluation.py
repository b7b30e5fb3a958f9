"""`evaluation`: held-out loss and perplexity per data domain of one checkpoint.

Requested by the checkpoint sensor for the checkpoints each segment run recorded (run tags
fm/checkpoint_steps, fm/checkpoint_step), or materialized from the UI for the newest one.
Runs with the blocking `checkpoint_valid` check in the same run: a corrupt copy skips the
evaluation. The evaluation itself runs in a fresh process (fm_pipeline.eval) that scores
the run's checkpoints in turn; each is one materialization of the job's partition (the
newest last), the checkpoint's `eval` mark and an MLflow child run of the job.
"""

from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
)
from fm_pipeline.assets.training.checkpoints import checkpoint, checkpoints_for_run
from fm_pipeline.dagster_runs.names import GROUP, training_jobs
from fm_pipeline.resources.mlflow import MlflowTrackingResource
from fm_pipeline.resources.store import ObjectStoreResource
from pydantic import Field

from fm_pipeline.orchestration import registered_job


class EvaluationConfig(Config):
    max_batches: int = Field(default=8, ge=1, description="held-out batches per domain "
                                                          "(of training.micro_batch_size windows)")
    nproc: int = Field(default=1, ge=1, description="ranks (torchrun when > 1)")


def _table(result) -> str:
    rows = ["| domain | loss | perplexity | tokens |", "|---|---|---|---|"]
    for name, d in result.domains.items():
        if d.loss is None:
            rows.append(f"| {name} | - | - | 0 |")
        else:
            rows.append(f"| {name} | {d.loss:.4f} | {d.perplexity:.2f} | {d.tokens:,} |")
    return "\n".join(rows)


@asset(partitions_def=training_jobs, group_name=GROUP, deps=[checkpoint], kinds={"pytorch"})
def evaluation(context: AssetExecutionContext, config: EvaluationConfig,
               store: ObjectStoreResource, mlflow: MlflowTrackingResource) -> MaterializeResult:
    """Held-out loss and perplexity per data domain of each checkpoint the run is about (one
    materialization per checkpoint, the newest last)."""
    from fm_pipeline.eval import evaluate_checkpoints
    from fm_pipeline.orchestration.checkpoints import preferred_copy

    target, site = store.open(), store.site()
    job = registered_job(target, context.partition_key)
    chosen = checkpoints_for_run(context, job.name, target, site=site)
    # The local copy where this machine trained it: no download.
    results = evaluate_checkpoints([preferred_copy(copies, tier="local") for _, copies in chosen],
                                   site=site, job=job, store=target, nproc=config.nproc,
                                   max_batches=config.max_batches)
    entries = []
    for (step, copies), result in zip(chosen, results, strict=True):
        context.log.info(result.summary())
        entries.append(_materialization(job, step, copies, result, config=config,
                                        mlflow=mlflow, run_id=context.run.run_id))
    for metadata in entries[:-1]:
        context.log_event(AssetMaterialization(asset_key=context.asset_key,
                                               partition=context.partition_key,
                                               metadata=metadata))
    return MaterializeResult(metadata=entries[-1])


def _materialization(job, step: int, copies, result, *, config: EvaluationConfig, mlflow,
                     run_id: str) -> dict:
    """One checkpoint's evaluation as metadata, after its MLflow child run is logged."""
    from fm_pipeline.orchestration.checkpoints import preferred_copy

    metrics = {}
    for name, d in result.domains.items():
        if d.loss is not None:
            metrics[f"{name}/loss"], metrics[f"{name}/perplexity"] = d.loss, d.perplexity
    if result.loss is not None:
        metrics["loss"], metrics["perplexity"] = result.loss, result.perplexity
    uri = preferred_copy(copies, tier="store").location
    ml_run = mlflow.log_evaluation(job, checkpoint_step=step, checkpoint_uri=uri,
                                   metrics=metrics, dagster_run_id=run_id,
                                   params={"eval": {"max_batches": config.max_batches,
                                                    "topology": result.topology}})
    metadata = {"checkpoint_step": step, "checkpoint": MetadataValue.path(uri),
                **{k: round(v, 6) for k, v in metrics.items()},
                "domains": MetadataValue.md(_table(result)),
                "topology": result.topology, "wall_s": round(result.wall_s, 3),
                "mlflow_run_id": ml_run}
    if url := mlflow.run_url(ml_run):
        metadata["mlflow"] = MetadataValue.url(url)
    return metadata
