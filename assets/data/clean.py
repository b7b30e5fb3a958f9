"""`clean_documents` as a graph of tasks: Dagster's executor fans the cleaning of each file
group, each band range of the near-dedup buckets and each clean part out over its
processes (`multiprocess` with `data.workers` > 1; `k8s_job_executor` past one machine).

    plan_cleaning_tasks -> clean_file_group x tasks -> plan_bucket_tasks -> lsh_buckets x
    band ranges -> cluster_duplicates -> write_clean_part x tasks -> finish_cleaning

Every op is a thin call into `fm_pipeline.data.clean_stages`, which writes each task's
objects and receipt to the store: a run that stopped half-way resumes task by task. Ops
pass only task numbers between them.
"""

from dagster import (
    DynamicOut,
    DynamicOutput,
    MetadataValue,
    OpExecutionContext,
    Output,
    graph_asset,
    op,
)
from fm_pipeline.assets.data.markdown import markdown_table
from fm_pipeline.assets.data.steps import mapping_key, peak_rss_mib
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.data import clean_stages as stages

GROUP = "data"


@op(out=DynamicOut(int))
def plan_cleaning_tasks(context: OpExecutionContext, job_spec: JobSpecResource,
                        store: ObjectStoreResource):
    """The file groups of every source (`data.task_bytes` each), one task per group."""
    job, target = job_spec.load(), store.open()
    if stages.clean_done(job, target):  # every later op then has nothing to do either
        context.log.info("the clean corpus is already written")
        return
    plan = stages.plan_clean(job, target)
    context.log.info(f"{len(plan.tasks)} cleaning task(s) over "
                     f"{sum(len(t.files) for t in plan.tasks):,} files")
    for i, task in enumerate(plan.tasks):
        yield DynamicOutput(i, mapping_key=mapping_key(task.name))


@op
def clean_file_group(context: OpExecutionContext, job_spec: JobSpecResource,
                     store: ObjectStoreResource, task: int):
    """Read, normalise, filter and sign one file group."""
    job, target = job_spec.load(), store.open()
    plan = stages.plan_clean(job, target)
    receipt = stages.clean_task(job, target, plan, plan.tasks[task])
    context.log.info(f"{plan.tasks[task].name}: read {receipt.read}, kept {receipt.kept}, "
                     f"dropped {receipt.dropped or 'none'}")
    return Output(receipt.kept, metadata={"read": receipt.read, "kept": receipt.kept,
                                          "peak_rss_mib": peak_rss_mib()})


@op(out=DynamicOut(list))
def plan_bucket_tasks(context: OpExecutionContext, job_spec: JobSpecResource,
                      store: ObjectStoreResource, kept: list[int]):
    """One bucket task per range of LSH bands; none without near dedup."""
    job, target = job_spec.load(), store.open()
    bands = [] if stages.clean_done(job, target) else stages.band_tasks(job)
    context.log.info(f"{sum(kept):,} documents to deduplicate; {len(bands)} bucket task(s)")
    for b in bands:
        yield DynamicOutput([b.start, b.stop], mapping_key=f"bands_{b.start}_{b.stop}")


@op
def lsh_buckets(context: OpExecutionContext, job_spec: JobSpecResource,
                store: ObjectStoreResource, bands: list):
    """Documents that share a band, kept as a pair when their signatures agree."""
    job, target = job_spec.load(), store.open()
    pairs = stages.bucket_task(job, target, stages.plan_clean(job, target), range(*bands))
    context.log.info(f"bands {bands[0]}-{bands[1] - 1}: {pairs:,} similar pairs")
    return Output(pairs, metadata={"pairs": pairs, "peak_rss_mib": peak_rss_mib()})


@op(out=DynamicOut(int))
def cluster_duplicates(context: OpExecutionContext, job_spec: JobSpecResource,
                       store: ObjectStoreResource, pairs: list[int]):
    """Exact and near pairs -> clusters -> a decision per document; then one part per task."""
    job, target = job_spec.load(), store.open()
    if stages.clean_done(job, target):
        return
    plan = stages.plan_clean(job, target)
    dedup = stages.cluster_stage(job, target, plan)
    context.log.info(f"{dedup.documents:,} documents, removed {dedup.removed or 'none'}")
    for i, task in enumerate(plan.tasks):
        yield DynamicOutput(i, mapping_key=mapping_key(task.name))


@op
def write_clean_part(job_spec: JobSpecResource, store: ObjectStoreResource, task: int):
    job, target = job_spec.load(), store.open()
    plan = stages.plan_clean(job, target)
    kept = stages.filter_task(job, target, plan, plan.tasks[task]).counts.kept
    return Output(kept, metadata={"kept": kept, "peak_rss_mib": peak_rss_mib()})


@op
def finish_cleaning(job_spec: JobSpecResource, store: ObjectStoreResource, kept: list[int]):
    job, target = job_spec.load(), store.open()
    receipt = stages.finish_clean(job, target, stages.plan_clean(job, target))
    return Output(receipt.mix_key, metadata={
        "mix_key": receipt.mix_key,
        "tasks": receipt.tasks,
        "documents_kept": sum(c.kept for c in receipt.sources.values()),
        "documents_dropped": sum(c.dropped_total for c in receipt.sources.values()),
        "dropped_by_reason": MetadataValue.json({n: c.dropped for n, c in receipt.sources.items()}),
        "dropped_examples": MetadataValue.json(receipt.examples),
        "dedup_ratio": round(receipt.dedup_ratio(), 6),
        "per_source": MetadataValue.md(markdown_table(
            ["source", "read", "kept", "held out", "chars kept", "dropped"],
            [[n, c.read, c.kept, c.heldout, c.chars_kept, c.dropped or "-"]
             for n, c in receipt.sources.items()])),
    })


@graph_asset(group_name=GROUP, kinds={"python"})
def clean_documents():
    """Sources read, UTF-8 normalised (NFC), length-filtered and exactly deduplicated; with
    the spec's options also PII-masked, quality-filtered and near-deduplicated (each drop
    reason counted per source in `dropped_by_reason`), in tasks over file groups."""
    kept = plan_cleaning_tasks().map(clean_file_group).collect()
    pairs = plan_bucket_tasks(kept).map(lsh_buckets).collect()
    parts = cluster_duplicates(pairs).map(write_clean_part).collect()
    return finish_cleaning(parts)
