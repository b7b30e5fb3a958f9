"""`token_shards` as a graph of tasks: one per clean part, fanned out over the executor's
processes like the cleaning (fm_pipeline.data.shard_stages writes each part's shards and
receipt, so a stopped run resumes part by part).

    plan_shard_tasks -> tokenize_part x clean parts -> finish_token_shards
"""

from dagster import (
    AssetIn,
    DynamicOut,
    DynamicOutput,
    In,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Output,
    graph_asset,
    op,
)
from fm_pipeline.assets.data.clean import GROUP
from fm_pipeline.assets.data.steps import (
    LogProgress,
    concurrent_steps,
    mapping_key,
    peak_rss_mib,
)
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.data import shard_stages as stages
from fm_pipeline.data.tokenizer import share_encoder_cores


@op(ins={"tokenizer": In(Nothing)}, out=DynamicOut(int))
def plan_shard_tasks(context: OpExecutionContext, job_spec: JobSpecResource,
                     store: ObjectStoreResource):
    """One task per clean part of every source; none when the shards are already cut with
    the stored tokenizer."""
    job, target = job_spec.load(), store.open()
    if stages.shards_done(job, target):
        context.log.info("the token shards are already cut with the stored tokenizer")
        return
    tasks = stages.shard_tasks(job, target)
    context.log.info(f"{len(tasks)} tokenizing task(s), one per clean part")
    for i, task in enumerate(tasks):
        yield DynamicOutput(i, mapping_key=mapping_key(task.name))


@op
def tokenize_part(context: OpExecutionContext, job_spec: JobSpecResource,
                  store: ObjectStoreResource, task: int):
    """Encode one clean part and cut its shards; beside other steps in processes of their
    own, the encoder takes its share of the cores."""
    side_by_side = concurrent_steps(context)
    threads = share_encoder_cores(side_by_side) if side_by_side else None
    job, target = job_spec.load(), store.open()
    part = stages.shard_tasks(job, target)[task]
    receipt = stages.shard_part(job, target, part, progress=LogProgress(context))
    tokens = sum(s.tokens for s in receipt.shards)
    return Output(tokens, metadata={"documents": receipt.documents, "tokens": tokens,
                                    "shards": len(receipt.shards),
                                    "encoder_threads": threads or "every core",
                                    "peak_rss_mib": peak_rss_mib()})


@op
def finish_token_shards(job_spec: JobSpecResource, store: ObjectStoreResource,
                        tokens: list[int]):
    job, target = job_spec.load(), store.open()
    receipt = stages.shards_done(job, target) or stages.finish_shards(
        job, target, stages.shard_tasks(job, target))
    return Output(receipt.mix_key, metadata={
        "mix_key": receipt.mix_key, "dtype": receipt.dtype, "shard_tokens": receipt.capacity,
        "shards": sum(len(v) for v in receipt.shards.values()),
        "tokens_per_source": MetadataValue.json({
            s: {"train": receipt.tokens(s, "train"), "heldout": receipt.tokens(s, "heldout")}
            for s in receipt.shards}),
        "tokens": sum(e.tokens for v in receipt.shards.values() for e in v),
    })


@graph_asset(group_name=GROUP, kinds={"python"},
             ins={"tokenizer": AssetIn(key="tokenizer", dagster_type=Nothing)})
def token_shards(tokenizer):
    """Shards of token ids (uint16 when the vocabulary fits), each with SHA-256: each clean
    part encoded and cut by its own task, whole sample windows per shard."""
    tokens = plan_shard_tasks(tokenizer=tokenizer).map(tokenize_part).collect()
    return finish_token_shards(tokens)
