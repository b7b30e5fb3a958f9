"""The `training_plan` asset: materialized in process from a job spec, recorded on disk."""

from __future__ import annotations

import json

from tests.conftest import REPO


def test_training_plan_materializes_from_the_job_spec(fm_home):
    from dagster import materialize
    from fm_pipeline.assets.plan import training_plan
    from fm_pipeline.resources.job_spec import JobSpecResource

    result = materialize(
        [training_plan],
        resources={"job_spec": JobSpecResource(path=str(REPO / "configs" / "demo.yaml"))},
    )
    assert result.success
    plan = result.output_for_node("training_plan")
    assert plan["estimate"]["fits"] and plan["estimate"]["layout"]["dp"] == 2
    assert plan["alternatives"] and plan["rank_placement"][0]["rank"] == 0
    meta = result.asset_materializations_for_node("training_plan")[0].metadata
    assert meta["predicted_mfu"].value == round(plan["estimate"]["mfu"], 4)
    saved = json.loads((fm_home / "runs" / "demo" / "plan.json").read_text())
    assert saved["estimate"]["step_time_s"] == plan["estimate"]["step_time_s"]


def test_the_code_location_includes_the_plan():
    from fm_pipeline.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "training_plan" in keys
