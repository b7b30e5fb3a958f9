"""The data mix past one machine: `fm k8s render-data` writes data_mix_job_k8s's run config
(dagster-k8s's k8s_job_executor, checked against that executor's own config schema), the job
spec's ConfigMap and the Job a step becomes (built by the executor's construct_dagster_k8s_job
and validated strictly); bad input writes nothing and names the problem."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from fm_pipeline.cli.k8s import app
from fm_pipeline.defaults import DEMO_JOB

runner = CliRunner()


def render(tmp_path, *extra):
    return runner.invoke(app, ["render-data", "--job", str(DEMO_JOB), "--out", str(tmp_path / "out"),
                               "--store-uri", "s3://bucket/fm", *extra], env={"COLUMNS": "200"})


def test_render_data_writes_a_checked_run_config_and_the_step_job(tmp_path):
    result = render(tmp_path, "--set", "data.workers=6", "--credentials-secret", "s3-creds",
                    "--s3-endpoint", "http://minio:9000", "--step-memory", "6Gi")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    run_config = yaml.safe_load((out / "data-run-config.yaml").read_text())
    executor = run_config["execution"]["config"]
    assert executor["max_concurrent"] == 6 and executor["job_image"] == "fm-pipeline:latest"
    assert run_config["resources"]["job_spec"]["config"]["path"] == "/etc/fm/job.yaml"
    (config_map,) = [p for p in out.iterdir() if p.name.startswith("configmap-")]
    spec = yaml.safe_load(yaml.safe_load(config_map.read_text())["data"]["job.yaml"])
    assert spec["data"]["workers"] == 6  # the steps read the spec the run config names
    job = yaml.safe_load((out / "data-step-job.yaml").read_text())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "6Gi"
    assert {"name": "FM_STORE_URI", "value": "s3://bucket/fm"} in container["env"]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert container["volumeMounts"][0]["mountPath"] == "/etc/fm"
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert volumes == [{"name": "job-spec", "configMap": {"name": "demo-data-spec"}}]
    # The code location's job takes the same run config.
    from dagster import validate_run_config

    from fm_pipeline.definitions import defs

    validate_run_config(defs.resolve_job_def("data_mix_job_k8s"), run_config)


def test_the_executor_schema_refuses_what_k8s_job_executor_does_not_know(tmp_path):
    from dagster._core.errors import DagsterInvalidConfigError
    from fm_pipeline.assets.data.k8s import check_k8s_run_config

    assert render(tmp_path).exit_code == 0
    run_config = yaml.safe_load((tmp_path / "out" / "data-run-config.yaml").read_text())
    run_config["execution"]["config"]["max_concurent"] = 2  # a typo
    with pytest.raises(DagsterInvalidConfigError, match="max_concurent"):
        check_k8s_run_config(run_config)


@pytest.mark.parametrize("extra, words", [
    (["--step-memory", "4 GB"], "resources.limits.memory: '4 GB' is not a quantity"),
    (["--namespace", "Data NS"], "metadata.namespace: 'Data NS' must be a DNS label"),
    (["--store-uri", "/mnt/store"], "--store-uri must be s3://bucket/prefix"),
])
def test_bad_input_writes_nothing_and_names_the_problem(tmp_path, extra, words):
    result = render(tmp_path, *extra)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_loading_the_code_location_does_not_import_dagster_k8s():
    """data_mix_job_k8s defers dagster-k8s (and the kubernetes client, ~0.8 s) to its runs."""
    out = subprocess.run(
        [sys.executable, "-c", ("import sys, fm_pipeline.definitions as d; "
                                "d.defs.resolve_job_def('data_mix_job_k8s'); "
                                "print('dagster_k8s' in sys.modules)")],
        capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
