"""The `training_plan` asset: one partition per training job, planned once per spec and
kept beside the spec in the store; later materializations read it back."""

from __future__ import annotations

import json


def test_training_plan_materializes_per_job_and_is_planned_once(fm_home, monkeypatch):
    from dagster import DagsterInstance, materialize
    from fm_pipeline.dagster_runs.names import JOBS_PARTITION
    from fm_pipeline.assets.training.plan import training_plan
    from fm_pipeline.resources.store import ObjectStoreResource

    from fm_pipeline.data.testing import small_job
    from fm_pipeline.orchestration import register_job
    from fm_pipeline.orchestration.registry import plan_key
    from fm_pipeline.planner import job_plan as planner

    job = small_job(name="planned", **{"parallelism.nproc_per_node": 2})
    store = ObjectStoreResource().open()
    register_job(store, job)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(JOBS_PARTITION, [job.name])
    result = materialize([training_plan], partition_key=job.name, instance=instance,
                         resources={"store": ObjectStoreResource()})
    assert result.success
    plan = result.output_for_node("training_plan")
    assert plan["estimate"]["fits"] and plan["estimate"]["layout"]["dp"] == 2
    assert plan["alternatives"] and plan["rank_placement"][0]["rank"] == 0
    meta = result.asset_materializations_for_node("training_plan")[0].metadata
    assert meta["predicted_mfu"].value == round(plan["estimate"]["mfu"], 4)
    stored = json.loads(store.get_bytes(plan_key(job.name)))
    assert stored["plan"]["estimate"]["step_time_s"] == plan["estimate"]["step_time_s"]

    calls = []
    monkeypatch.setattr(planner, "plan_for_job", lambda *a, **k: calls.append(a))
    again = materialize([training_plan], partition_key=job.name, instance=instance,
                        resources={"store": ObjectStoreResource()})
    assert again.output_for_node("training_plan") == plan and calls == []  # read back


def test_the_code_location_includes_the_plan():
    from fm_pipeline.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "training_plan" in keys
