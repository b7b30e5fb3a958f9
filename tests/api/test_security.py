"""Tokens, tenant isolation, admin powers, secrets kept out of logs and off disk."""

from __future__ import annotations

import logging

import pytest

from fm_pipeline.api.auth import redact, tokens_path
from tests.api.conftest import auth
from tests import local_site


@pytest.fixture
def research_job(client, tokens, seed_body) -> str:
    body = {**seed_body, "priority": "normal", "gpus": 8,
            "parallelism": {"tp": 4, "pp": 2, "dp": 1}}
    r = client.post("/v1/training/jobs", json=body, headers=auth(tokens["research"]))
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


@pytest.mark.parametrize("method, suffix", [
    ("get", ""), ("get", "/checkpoints"), ("get", "/evaluations"), ("get", "/events"),
    ("post", "/cancel"), ("post", "/resume"),
])
def test_a_tenant_cannot_see_or_touch_another_tenants_job(client, tokens, research_job,
                                                          method, suffix):
    url = f"/v1/training/jobs/{research_job}{suffix}"
    r = getattr(client, method)(url, headers=auth(tokens["prod"]))
    assert r.status_code == 404
    # exactly what a job that does not exist looks like
    missing = getattr(client, method)(f"/v1/training/jobs/job-0000000000{suffix}",
                                      headers=auth(tokens["prod"]))
    assert (missing.status_code, missing.json()["detail"].split()[0]) == (404, "no")
    assert client.get(f"/v1/training/jobs/{research_job}",
                      headers=auth(tokens["research"])).json()["status"] == "running"


def test_listing_shows_only_the_callers_jobs_and_admin_sees_all(client, tokens, research_job,
                                                                seed_body):
    prod_job = client.post("/v1/training/jobs", json=seed_body,
                           headers=auth(tokens["prod"])).json()["job_id"]
    ids = lambda r: [j["job_id"] for j in r.json()["jobs"]]  # noqa: E731
    assert ids(client.get("/v1/training/jobs", headers=auth(tokens["prod"]))) == [prod_job]
    assert ids(client.get("/v1/training/jobs?tenant=research",
                          headers=auth(tokens["prod"]))) == []
    admin = auth(tokens["admin"])
    assert ids(client.get("/v1/training/jobs", headers=admin)) == [research_job, prod_job]
    assert ids(client.get("/v1/training/jobs?tenant=research", headers=admin)) == [research_job]
    assert ids(client.get("/v1/training/jobs?status=queued", headers=admin)) == []


def test_admin_may_preempt_and_cancel_any_job_tenants_may_not_preempt(client, plane, tokens,
                                                                      research_job):
    url = f"/v1/training/jobs/{research_job}"
    r = client.post(f"{url}/preempt", headers=auth(tokens["research"]))
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    r = client.post(f"{url}/preempt", headers=auth(tokens["admin"]))
    assert (r.status_code, r.json()["status"]) == (202, "preempting")
    assert plane.orchestrator.calls[-1] == ("preempt", research_job, None)
    r = client.post(f"{url}/cancel", headers=auth(tokens["admin"]))
    assert (r.status_code, r.json()["status"]) == (202, "cancelling")
    plane.orchestrator.end(research_job, "cancelled", "cancelled by admin")
    plane.reconcile()
    assert client.get(url, headers=auth(tokens["research"])).json()["status"] == "cancelled"
    assert client.post(f"{url}/cancel", headers=auth(tokens["research"])).status_code == 409


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer fmt_not-a-real-token-at-all-000000"},
    {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer"},
])
def test_requests_without_a_valid_token_get_401(client, headers, seed_body):
    for r in (client.get("/v1/training/jobs", headers=headers),
              client.post("/v1/training/jobs", json=seed_body, headers=headers)):
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"


def test_tokens_are_stored_hashed_and_revocable(tokens, client):
    on_disk = tokens_path(local_site.site()).read_text()
    assert all(token not in on_disk for token in tokens.values())
    assert (tokens_path(local_site.site()).stat().st_mode & 0o777) == 0o600
    store = local_site.token_store()
    entry = next(e for e in store.entries() if e["tenant"] == "research")
    assert store.verify(tokens["research"]).tenant == "research"
    assert store.verify(tokens["admin"]).is_admin
    assert store.revoke(entry["id"])
    assert client.get("/v1/training/jobs", headers=auth(tokens["research"])).status_code == 401


def test_tokens_never_reach_the_logs(client, plane, tokens, seed_body, caplog):
    caplog.set_level(logging.DEBUG)
    leaked = "fmt_leakedleakedleakedleakedleaked0000"
    for token in (*tokens.values(), leaked):
        h = auth(token)
        client.get("/v1/training/jobs", headers=h)
        client.post("/v1/training/jobs", json=seed_body, headers=h)
        client.post("/v1/training/jobs", json={**seed_body, "model": token}, headers=h)
        client.get(f"/v1/training/jobs/{token[:60].lower()}", headers=h)
    plane.reconcile()
    # The service's records (the test client's own request log is not the service's).
    service = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    text = "\n".join(f"{r.name} {r.getMessage()}" for r in service)
    assert "submitted by tenant prod" in text  # the service did log its work
    for token in (*tokens.values(), leaked):
        assert token not in text


def test_redaction_masks_tokens_and_bearer_credentials():
    token = local_site.token_store().issue(tenant="research")[1]
    line = f"GET /x Authorization: Bearer {token} token={token}"
    assert token not in redact(line)
    assert "Bearer [redacted]" in redact(line)
