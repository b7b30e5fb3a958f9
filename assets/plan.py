"""The `training_plan` asset: the planner's checked plan for the job spec (group "plan").

    dagster dev -w workspace.yaml      # materialize training_plan (resource "job_spec")

Thin: it calls `fm_pipeline.planner.job_plan.plan_for_job`, writes the plan to
`runs_dir(job)/plan.json` and returns it (downstream assets take it as an input), with the
headline predictions as metadata. Wiring it after `data_mix` and logging it to MLflow is the
orchestration layer's job.
"""


from dagster import AssetExecutionContext, Definitions, MetadataValue, Output, asset
from fm_pipeline.resources.job_spec import JobSpecResource

from fm_pipeline.config.paths import runs_dir
from fm_pipeline.planner.job_plan import plan_for_job, save_plan

GROUP = "plan"


@asset(group_name=GROUP, kinds={"python"}, deps=["data_mix"])  # lineage: plan after the mix
def training_plan(context: AssetExecutionContext, job_spec: JobSpecResource) -> Output[dict]:
    """Memory per GPU, predicted step time and MFU, checkpoint interval, time-to-train and
    $/token for the job's declared layout, beside the search's best alternatives."""
    job = job_spec.load()
    plan = plan_for_job(job)
    path = save_plan(plan, runs_dir(job.name) / "plan.json")
    est = plan["estimate"]
    for warning in est["warnings"]:
        context.log.warning(warning)
    best = plan["alternatives"][0] if plan["alternatives"] else None
    return Output(plan, metadata={
        "layout": MetadataValue.json(est["layout"]),
        "fits": est["fits"],
        "memory_gib_per_gpu": round(est["memory_gib_per_gpu"], 3),
        "predicted_step_time_s": est["step_time_s"],
        "predicted_mfu": round(est["mfu"], 4),
        "predicted_tokens_per_s": round(est["tokens_per_s"], 1),
        "bubble_fraction": round(est["bubble_fraction"], 4),
        "exposed_comm_fraction": round(est["exposed_comm_fraction"], 4),
        "checkpoint_every_steps_recommended": plan["checkpoint"]["recommended_every_steps"],
        "checkpoint_every_steps_configured": plan["checkpoint"]["configured_every_steps"],
        "goodput": round(est["reliability"]["goodput"], 4),
        "time_to_train_days": round(est["cost"]["time_to_train_days"], 4),
        "dollars": round(est["cost"]["dollars"], 2),
        "dollars_per_million_tokens": round(est["cost"]["dollars_per_million_tokens"], 4),
        "best_alternative": best["layout"] if best else "none fits",
        "best_alternative_mfu": round(best["mfu"], 4) if best else 0.0,
        "warnings": MetadataValue.md("\n".join(f"- {w}" for w in est["warnings"]) or "none"),
        "plan_path": MetadataValue.path(str(path)),
    })


# The "job_spec" resource comes from the data area's definitions (one resource per key).
defs = Definitions(assets=[training_plan])
