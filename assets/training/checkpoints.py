"""`checkpoint`: the job's committed checkpoints, one materialization per checkpoint, and
`checkpoint_valid`, the blocking check that every copy of a checkpoint is whole.

A segment run materializes `checkpoint` after `training_segment`: every checkpoint the job
committed since the last one recorded (oldest first), each with its step, tokens, size,
topology and URIs. `checkpoint_valid` re-reads them (manifest, sizes, checksums, DCP
metadata, model) in both tiers; in an evaluation run it checks the checkpoint about to be
evaluated (run tag fm/checkpoint_step), and a failure there skips the evaluation.
"""

import warnings

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetExecutionContext,
    AssetMaterialization,
    Failure,
    MaterializeResult,
    MetadataValue,
    PreviewWarning,
    asset,
    asset_check,
)
from fm_pipeline.assets.training.segment import training_segment
from fm_pipeline.dagster_runs.history import CHECKPOINT, recorded_checkpoints
from fm_pipeline.dagster_runs.names import GROUP, checkpoint_steps_of, training_jobs
from fm_pipeline.orchestration import registered_job
from fm_pipeline.resources.store import ObjectStoreResource


def _metadata(facts: dict, copies) -> dict:
    uri = facts.pop("location")
    data = {k: v for k, v in facts.items() if v is not None and k != "tier"}
    data["uri"] = MetadataValue.path(uri)
    for ref in copies:
        data["local_path" if ref.is_local else "store_uri"] = MetadataValue.path(ref.location)
    return data


@asset(partitions_def=training_jobs, group_name=GROUP, deps=[training_segment],
       kinds={"pytorch"})
def checkpoint(context: AssetExecutionContext, store: ObjectStoreResource) -> MaterializeResult:
    """Every checkpoint the job committed since the last one recorded, oldest first (the
    durable store copy is the URI when it exists); re-records the newest if none is new."""
    from fm_pipeline.orchestration.checkpoints import (
        await_evaluation,
        committed_steps,
        describe,
        preferred_copy,
    )

    name = context.partition_key
    target = store.open()
    registered_job(target, name)  # a clear error for an unknown job
    steps = committed_steps(name, target, root=store.site().checkpoints_dir(name))
    if not steps:
        raise Failure(description=f"job {name} has no committed checkpoint yet")
    last = max((r["step"] for r in recorded_checkpoints(context.instance, name, limit=1)),
               default=-1)
    new = [s for s in sorted(steps) if s > last] or [max(steps)]
    for step in new:  # the evaluation sensor evaluates each: retention must wait for it
        await_evaluation(steps[step], step=step)
    for step in new[:-1]:
        copies = steps[step]
        context.log_event(AssetMaterialization(
            asset_key=CHECKPOINT, partition=name,
            metadata=_metadata(describe(preferred_copy(copies, tier="store")), copies)))
    copies = steps[new[-1]]
    context.log.info(f"{name}: recorded checkpoint step(s) {new}")
    return MaterializeResult(
        metadata=_metadata(describe(preferred_copy(copies, tier="store")), copies))


def steps_to_check(context, job_name: str) -> list[int]:
    """The checkpoints named by the run's tags (fm/checkpoint_steps, fm/checkpoint_step),
    else those this run recorded, else the newest recorded."""
    if tagged := checkpoint_steps_of(context.run.tags):
        return tagged
    mine = recorded_checkpoints(context.instance, job_name, run_id=context.run.run_id)
    if mine:
        return sorted(r["step"] for r in mine)
    newest = recorded_checkpoints(context.instance, job_name, limit=1)
    return [newest[0]["step"]] if newest else []


def _checkpoint_valid(context: AssetCheckExecutionContext,
                      store: ObjectStoreResource) -> AssetCheckResult:
    from fm_pipeline.catalog import validate
    from fm_pipeline.orchestration.checkpoints import committed_steps

    name = context.partition_key
    target = store.open()
    job = registered_job(target, name)
    steps = committed_steps(name, target, root=store.site().checkpoints_dir(name))
    problems: list[str] = []
    checked = steps_to_check(context, name)
    copies_checked = 0
    for step in checked:
        if step not in steps:
            problems.append(f"step {step}: no committed copy left (deleted or never written)")
            continue
        for ref in steps[step]:
            copies_checked += 1
            problems += [f"{ref.location}: {p}" for p in validate(ref, job)]
    return AssetCheckResult(
        passed=bool(checked) and not problems,
        metadata={"steps": MetadataValue.json(checked), "copies_checked": copies_checked,
                  "problems": MetadataValue.md("\n".join(f"- {p}" for p in problems) or
                                               ("none" if checked else "no checkpoint"))},
        description=(f"{len(problems)} problem(s): {problems[0]}" if problems else
                     f"steps {checked}: every copy valid"))


with warnings.catch_warnings():  # a partitioned asset check is a "preview" feature in 1.13
    warnings.simplefilter("ignore", PreviewWarning)
    checkpoint_valid = asset_check(
        asset=checkpoint, name="checkpoint_valid", blocking=True, partitions_def=training_jobs,
        description="Every copy (local tier, object store) of the checkpoint has its manifest, "
                    "every file with its size and checksum, readable DCP metadata and the "
                    "job's model; blocks evaluation otherwise.")(_checkpoint_valid)


def checkpoint_for_run(context, job_name: str, store, *, site) -> tuple[int, list]:
    """(step, committed copies) of the checkpoint a drill run is about: the run's
    fm/checkpoint_step tag, else the newest committed one."""
    return checkpoints_for_run(context, job_name, store, site=site)[-1]


def checkpoints_for_run(context, job_name: str, store, *, site) -> list[tuple[int, list]]:
    """[(step, committed copies)] of the checkpoints an evaluation or drill run is about,
    oldest first: the run's tags, else the newest committed one."""
    from fm_pipeline.orchestration.checkpoints import committed_steps

    steps = committed_steps(job_name, store, root=site.checkpoints_dir(job_name))
    tagged = checkpoint_steps_of(context.run.tags)
    if tagged:
        if missing := [s for s in tagged if s not in steps]:
            raise Failure(description=f"job {job_name} has no committed checkpoint at step(s) "
                                      f"{missing} (committed: {sorted(steps) or 'none'})",
                          allow_retries=False)
        return [(s, steps[s]) for s in tagged]
    if not steps:
        raise Failure(description=f"job {job_name} has no committed checkpoint yet",
                      allow_retries=False)
    step = max(steps)
    return [(step, steps[step])]
