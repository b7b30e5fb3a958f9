"""One table of cluster defaults, the same from every entry point: the planner's API, a job
spec's `cluster:` section and `fm plan` (which prints it with each default's source)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from fm_pipeline.cli.plan import app
from fm_pipeline.cluster_defaults import CLUSTER_DEFAULTS
from fm_pipeline.config.spec import ClusterSpec
from fm_pipeline.planner.cluster import ClusterConfig, cluster_from_spec, make_cluster


def test_every_cluster_field_has_one_default_with_its_source():
    fields = {f.name: f for f in dataclasses.fields(ClusterConfig)}
    assert set(fields) - {"accelerator"} == set(CLUSTER_DEFAULTS)
    for name, d in CLUSTER_DEFAULTS.items():
        assert len(d.source) > 20, name  # says where it comes from
        default = fields[name].default
        if default is not dataclasses.MISSING and d.value is not None:
            assert default == d.value, name
    spec = ClusterSpec.model_fields
    for name in set(spec) & set(CLUSTER_DEFAULTS):
        assert spec[name].default == CLUSTER_DEFAULTS[name].value, name


@pytest.mark.parametrize("gpu", ["h100", "a100-80gb", "b200"])
def test_the_planner_the_job_spec_and_the_cli_mean_the_same_cluster(gpu):
    from_api = make_cluster(gpu)
    from_spec = cluster_from_spec(ClusterSpec(accelerator=gpu))
    out = CliRunner().invoke(app, ["defaults", "--gpu-type", gpu, "--json"])
    assert out.exit_code == 0, out.output
    printed = {r["field"]: r for r in json.loads(out.stdout)["defaults"]}
    for name in CLUSTER_DEFAULTS:
        assert getattr(from_api, name) == getattr(from_spec, name) == printed[name]["value"], name
    # The catalog's own figures where the table defers to it (NVLink, NIC, price).
    acc = from_api.accelerator
    assert printed["intra_node_gbps"]["value"] == acc.intra_node_gbps
    assert printed["dollars_per_gpu_hour"]["value"] == acc.dollars_per_hour
    assert printed["restart_overhead_s"]["assumption"] is True


def test_the_table_prints_each_assumption_as_one():
    out = CliRunner().invoke(app, ["defaults", "--gpu-type", "h100"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "assumption: 4 nodes in a rack" in text and "fabric │ rail │ rail-optimised" in text
    assert "Amazon S3 Standard" in text and "assumption: Amazon" not in text
    bad = CliRunner().invoke(app, ["defaults", "--gpu-type", "tpu9"])
    assert bad.exit_code == 2 and "--gpu-type: unknown accelerator 'tpu9'" in bad.output
