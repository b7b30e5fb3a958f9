"""`evaluation`: held-out loss and perplexity per data domain of one checkpoint.

Requested by the checkpoint sensor for every new checkpoint (run tag fm/checkpoint_step),
or materialized from the UI for the newest one. Runs with the blocking `checkpoint_valid`
check in the same run: a corrupt copy skips the evaluation. The evaluation itself runs in
a fresh process (fm_pipeline.eval), is recorded as the checkpoint's `eval` mark and as an
MLflow child run of the job.
"""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from fm_pipeline.assets.training.checkpoints import checkpoint, checkpoint_for_run
from fm_pipeline.assets.training.names import GROUP, training_jobs
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
    """Held-out loss and perplexity per data domain of one checkpoint of the job."""
    from fm_pipeline.eval import evaluate_checkpoint
    from fm_pipeline.orchestration.checkpoints import preferred_copy

    target = store.open()
    job = registered_job(target, context.partition_key)
    step, copies = checkpoint_for_run(context, job.name, target)
    ref = preferred_copy(copies, tier="local")  # no download when this machine trained it
    result = evaluate_checkpoint(ref, job=job, store=target, nproc=config.nproc,
                                 max_batches=config.max_batches)
    context.log.info(result.summary())
    metrics = {}
    for name, d in result.domains.items():
        if d.loss is not None:
            metrics[f"{name}/loss"], metrics[f"{name}/perplexity"] = d.loss, d.perplexity
    if result.loss is not None:
        metrics["loss"], metrics["perplexity"] = result.loss, result.perplexity
    uri = preferred_copy(copies, tier="store").location
    ml_run = mlflow.log_evaluation(job, checkpoint_step=step, checkpoint_uri=uri,
                                   metrics=metrics, dagster_run_id=context.run.run_id,
                                   params={"eval": {"max_batches": config.max_batches,
                                                    "topology": result.topology}})
    metadata = {"checkpoint_step": step, "checkpoint": MetadataValue.path(uri),
                **{k: round(v, 6) for k, v in metrics.items()},
                "domains": MetadataValue.md(_table(result)),
                "topology": result.topology, "wall_s": round(result.wall_s, 3),
                "mlflow_run_id": ml_run}
    if url := mlflow.run_url(ml_run):
        metadata["mlflow"] = MetadataValue.url(url)
    return MaterializeResult(metadata=metadata)
