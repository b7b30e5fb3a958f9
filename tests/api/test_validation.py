"""Bad bodies get a 4xx that names the field; the service never answers 5xx to bad input."""

from __future__ import annotations

import pytest

from tests.api.conftest import auth


def _fields(response) -> list[str]:
    return [".".join(str(p) for p in d["loc"][1:]) for d in response.json()["detail"]]


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": "many"}, "gpus", "valid integer"),
        ({"gpus": 12}, "gpus", "whole number of nodes of 8 GPUs"),
        ({"gpus": 64, "parallelism": {"tp": 8, "pp": 8, "dp": 1}}, "gpus",
         "more than the whole pool"),
        ({"model": "gpt-17"}, "model", "unknown model size 'gpt-17'"),
        ({"parallelism": {"tp": 3, "pp": 2, "dp": 2}}, "parallelism", "must divide gpus"),
        ({"parallelism": {"tp": 4, "pp": 2, "dp": 4}}, "parallelism.dp", "must equal gpus (16)"),
        ({"parallelism": {"tp": 16, "pp": 1, "dp": 1}}, "parallelism.tp",
         "n_kv_heads (8) must be divisible by tp (16)"),
        ({"model": "llama3-3b", "parallelism": {"tp": 2, "pp": 8, "dp": 1}}, "parallelism.pp",
         "n_layers (28) must be divisible"),
        ({"parallelism": {"tp": 4, "pp": 2, "dq": 2}}, "parallelism.dq", "Extra inputs"),
        ({"checkpoint_every_steps": 0}, "checkpoint_every_steps", "greater than or equal to 1"),
        ({"data_manifest": "s3://elsewhere/data/0123456789abcdef/manifest.json"},
         "data_manifest", "outside the job store"),
        ({"data_manifest": "data/0123456789abcdef/manifest.json"}, "data_manifest",
         "no published mix 0123456789abcdef"),
        ({"data_manifest": "my-mix"}, "data_manifest", "names no mix"),
        ({"priority": "asap"}, "priority", "'low', 'normal', 'high' or 'urgent'"),
        ({"global_batch_size": 17}, "global_batch_size", "divisible by dp"),
        ({"tenant": "prod"}, "tenant", "Extra inputs"),
        # No coercion: JSON says what a value is.
        ({"gpus": "16"}, "gpus", "valid integer"),
        ({"gpus": True}, "gpus", "valid integer"),
        ({"checkpoint_every_steps": 500.5}, "checkpoint_every_steps", "valid integer"),
        ({"parallelism": {"tp": "4", "pp": 2, "dp": 2}}, "parallelism.tp", "valid integer"),
        ({"steps": False}, "steps", "valid integer"),
        ({"segment_steps": 0}, "segment_steps", "greater than or equal to 1"),
        ({"segment_steps": "20"}, "segment_steps", "valid integer"),
    ],
)
def test_bad_body_names_the_field(client, tokens, seed_body, change, field, words):
    r = client.post("/v1/training/jobs", json={**seed_body, **change}, headers=auth(tokens["prod"]))
    assert r.status_code == 422, r.text
    assert field in _fields(r), r.json()
    assert any(words in d["msg"] for d in r.json()["detail"]), r.json()


def test_priority_not_allowed_for_the_tenant_is_refused(client, tokens, seed_body):
    r = client.post("/v1/training/jobs", json=seed_body, headers=auth(tokens["research"]))
    assert r.status_code == 422 and _fields(r) == ["priority"]
    assert "tenant research may use priorities low, normal" in r.json()["detail"][0]["msg"]


def test_missing_fields_and_broken_json(client, tokens, seed_body):
    prod = auth(tokens["prod"])
    r = client.post("/v1/training/jobs", json={"gpus": 8}, headers=prod)
    assert r.status_code == 422 and {"model", "data_manifest"} <= set(_fields(r))
    r = client.post("/v1/training/jobs", content=b'{"model": ', headers={
        **prod, "content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    r = client.post("/v1/training/jobs", json=[seed_body], headers=prod)
    assert r.status_code == 422


def test_oversized_bodies_are_refused_with_413(client, tokens, seed_body):
    prod = auth(tokens["prod"])
    big = {**seed_body, "model": "x" * 70_000}
    assert client.post("/v1/training/jobs", json=big, headers=prod).status_code == 413

    def chunks():  # no Content-Length: the limit applies while reading
        for _ in range(100):
            yield b"x" * 1024

    r = client.post("/v1/training/jobs", content=chunks(), headers={
        **prod, "content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["detail"]


def test_resume_with_an_unknown_checkpoint_names_the_field(client, plane, tokens, seed_body):
    prod = auth(tokens["prod"])
    job_id = client.post("/v1/training/jobs", json=seed_body, headers=prod).json()["job_id"]
    r = client.post(f"/v1/training/jobs/{job_id}/resume", json={"checkpoint": "step-00000999"},
                    headers=prod)
    assert r.status_code == 422 and _fields(r) == ["checkpoint"]
    assert "committed: none yet" in r.json()["detail"][0]["msg"]
    r = client.post(f"/v1/training/jobs/{job_id}/resume", json={"checkpoint": 5}, headers=prod)
    assert r.status_code == 422 and _fields(r) == ["checkpoint"]


def test_every_problem_of_a_body_is_listed_at_once(client, tokens, seed_body):
    # The seed's 2,048-GPU job against the local pool of 8: too big, and more besides.
    body = {**seed_body, "gpus": 2048, "model": "fm-100b", "priority": "urgent",
            "parallelism": {"tp": 8, "pp": 16, "dp": 32},
            "data_manifest": "data/0123456789abcdef/manifest.json"}
    r = client.post("/v1/training/jobs", json=body, headers=auth(tokens["research"]))
    assert r.status_code == 422, r.text
    assert set(_fields(r)) == {"gpus", "priority", "parallelism.dp", "data_manifest"}, r.json()
    assert any("more than the whole pool" in d["msg"] for d in r.json()["detail"])


def test_resume_naming_a_checkpoint_marked_invalid_is_refused(client, plane, tokens, seed_body):
    from fm_pipeline.catalog import CheckpointRef
    from fm_pipeline.catalog.validate import Problem
    from fm_pipeline.catalog.validity import record_invalid
    from tests.api.progress_files import write_checkpoint

    prod = auth(tokens["prod"])
    job_id = client.post("/v1/training/jobs", json=seed_body, headers=prod).json()["job_id"]
    bad = write_checkpoint(job_id, step=500)
    write_checkpoint(job_id, step=1000)
    record_invalid(CheckpointRef.local(bad), [Problem("__0_0.distcp", "checksum mismatch")])
    r = client.post(f"/v1/training/jobs/{job_id}/resume", json={"checkpoint": "step-00000500"},
                    headers=prod)
    assert r.status_code == 422 and _fields(r) == ["checkpoint"], r.text
    assert "marked invalid" in r.json()["detail"][0]["msg"]
    assert "checksum mismatch" in r.json()["detail"][0]["msg"]
    r = client.post(f"/v1/training/jobs/{job_id}/resume", json={"checkpoint": "step-00001000"},
                    headers=prod)
    assert r.status_code == 202, r.text
