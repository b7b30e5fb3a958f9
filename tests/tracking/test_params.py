"""The job spec and the plan as MLflow params: dotted keys a user can filter on, values
within MLflow's limits, and no credential ever logged."""

from __future__ import annotations

import json

import pytest

from fm_pipeline.config import dump_job
from fm_pipeline.data.testing import small_job
from fm_pipeline.tracking.params import MAX_PARAM_VALUE, flatten_params, is_secret_key


def test_job_spec_becomes_dotted_params_that_round_trip():
    job = small_job(**{"training.lr": 0.02, "parallelism.nproc_per_node": 2})
    flat = flatten_params({"job": dump_job(job)})
    assert flat.params["job.name"] == "small"
    assert float(flat.params["job.training.lr"]) == 0.02
    assert flat.params["job.parallelism.nproc_per_node"] == "2"
    sources = json.loads(flat.params["job.data.sources"])
    assert [s["name"] for s in sources] == ["code", "prose"]
    assert all(isinstance(v, str) for v in flat.params.values())
    assert flat.redacted == [] and flat.truncated == []


def test_credentials_are_dropped_and_only_their_names_reported():
    secret_values = ["hunter2", "AKIAEXAMPLE", "wJalrXUtnFEMI", "ghp_abc123", "tok-777"]
    document = {"cluster": {"name": "gpu", "api_token": "ghp_abc123",
                            "s3": {"aws_access_key_id": "AKIAEXAMPLE",
                                   "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}},
                "credentials": {"user": "bob", "password": "hunter2"},
                "hfToken": "tok-777",
                "store": "s3://bob:hunter2@minio:9000/bucket"}
    flat = flatten_params({"job": document})
    for value in flat.params.values():
        assert not any(s in value for s in secret_values), value
    assert flat.params["job.cluster.name"] == "gpu"
    assert flat.params["job.store"] == "s3://bob:***@minio:9000/bucket"
    assert sorted(flat.redacted) == sorted([
        "job.cluster.api_token", "job.cluster.s3.aws_access_key_id",
        "job.cluster.s3.AWS_SECRET_ACCESS_KEY", "job.credentials", "job.hfToken"])


@pytest.mark.parametrize("name", ["mix_key", "flops_per_token", "tokens_per_step",
                                  "token_shards", "tokenizer", "sort_key"])
def test_training_names_that_merely_mention_keys_or_tokens_are_kept(name):
    assert not is_secret_key(name)
    assert flatten_params({name: 1}).params == {name: "1"}


def test_a_value_past_mlflow_limit_is_cut_visibly():
    flat = flatten_params({"plan": {"alternatives": list(range(5000))}})
    value = flat.params["plan.alternatives"]
    assert len(value) == MAX_PARAM_VALUE
    assert value.endswith("chars]") and "truncated" in value
    assert flat.truncated == ["plan.alternatives"]
