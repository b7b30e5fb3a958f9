"""The `training_plan` asset: each training job's checked plan (group "plan"), one partition
per job like every training asset.

Thin: `fm_pipeline.orchestration.registry.job_plan` plans the job's registered spec once and
keeps the plan beside it in the store (later materializations of the partition read it
back); the asset records the headline predictions as metadata and hands the plan to
`training_segment`, which compares each segment's measurements with it. It runs in every
segment run, so the lineage shows the plan each segment trained under.
"""


from dagster import AssetExecutionContext, MetadataValue, Output, asset
from fm_pipeline.dagster_runs.names import training_jobs
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.orchestration import registered_job
from fm_pipeline.orchestration.registry import job_plan
from fm_pipeline.planner.job_plan import save_plan

GROUP = "plan"


@asset(group_name=GROUP, kinds={"python"}, deps=["data_mix"], partitions_def=training_jobs)
def training_plan(context: AssetExecutionContext, store: ObjectStoreResource) -> Output:
    """Memory per GPU, predicted step time and MFU, checkpoint interval, time-to-train and
    $/token for the job's declared layout, beside the search's best alternatives."""
    target = store.open()
    job = registered_job(target, context.partition_key)
    plan = job_plan(target, job)
    if plan is None:
        return Output(None, metadata={"plan": "the planner cannot model this layout"})
    path = save_plan(plan, store.site().runs_dir(job.name) / "plan.json")
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
        # What the spec declares against the plan (planner.critique), each with a suggestion.
        "critique": MetadataValue.md("\n".join(
            f"- `{c['field']}`: {c['message']} (suggested: {c['suggested']})"
            for c in plan.get("critique", [])) or "none"),
        "plan_path": MetadataValue.path(str(path)),
    })
