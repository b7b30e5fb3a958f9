"""A job's spec is stored once, in the object store's registry; the API's queue keeps its
sha256. A spec changed behind the queue's back is refused at launch; a queue.db from before
(its spec in the row) is read and its spec registered the first time it is needed."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from fm_pipeline.config import dump_job, parse_job
from fm_pipeline.orchestration.registry import register_job, registered_job, spec_key
from fm_pipeline.storage import open_store
from tests import local_site
from tests.api.conftest import auth


def _submit(client, tokens, body) -> str:
    r = client.post("/v1/training/jobs", json=body, headers=auth(tokens["prod"]))
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


def test_the_queue_keeps_the_registered_specs_digest_not_the_spec(client, plane, tokens,
                                                                  seed_body, mix_store):
    job_id = _submit(client, tokens, seed_body)
    store = open_store(mix_store["root"])
    stored = store.get_bytes(spec_key(job_id))
    with sqlite3.connect(plane.store.path) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
        (digest,) = db.execute("SELECT spec_sha256 FROM jobs WHERE job_id = ?",
                               (job_id,)).fetchone()
    assert "spec" not in columns  # nowhere to keep a second copy
    assert digest == hashlib.sha256(stored).hexdigest()
    assert plane.job_spec(job_id) == registered_job(store, job_id)
    assert plane.job_spec(job_id).parallelism.tp == 4


def test_a_spec_changed_behind_the_queue_is_refused_naming_it(client, plane, tokens,
                                                               seed_body, mix_store):
    job_id = _submit(client, tokens, seed_body)
    store = open_store(mix_store["root"])
    changed = dump_job(registered_job(store, job_id))
    changed["training"]["steps"] += 1
    register_job(store, parse_job(changed, source="<changed>"), replace=True)
    with pytest.raises(ValueError, match=f"registered spec of training job '{job_id}'.*changed "
                                         "since it was queued"):
        plane.job_spec(job_id)


def test_a_queue_db_from_before_is_read_and_its_spec_registered(plane, mix_store, seed_body):
    from fm_pipeline.api.job_mapping import to_job_spec
    from fm_pipeline.api.schemas import JobCreate
    from fm_pipeline.api.store import JobStore

    tenant = plane.tenants.tenant("prod")
    job = to_job_spec(JobCreate(**seed_body), job_id="job-legacy", tenant=tenant,
                      store=open_store(mix_store["root"]), cluster=plane.tenants.cluster)
    path = local_site.site().api_dir / "legacy.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:  # the schema before the registry kept the spec
        db.executescript(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE NOT "
            "NULL, tenant TEXT NOT NULL, priority TEXT NOT NULL, gpus INTEGER NOT NULL, request "
            "TEXT NOT NULL, spec TEXT NOT NULL, submitted_at REAL NOT NULL, queue_state TEXT "
            "NOT NULL, stop_requested TEXT, cancelled_at REAL, resume_checkpoint TEXT);")
        db.execute("INSERT INTO jobs (job_id, tenant, priority, gpus, request, spec, "
                   "submitted_at, queue_state) VALUES ('job-legacy', 'prod', 'high', 16, ?, ?, "
                   "1.0, 'queued')", (json.dumps(seed_body), json.dumps(dump_job(job))))
    old = JobStore(path)
    try:
        (record,) = old.list()
        assert record.spec_sha256 is None and record.legacy_spec == dump_job(job)
        plane.store, mine = old, plane.store
        try:
            assert plane.job_spec("job-legacy") == job  # registered on first use
        finally:
            plane.store = mine
        stored = open_store(mix_store["root"]).get_bytes(spec_key("job-legacy"))
        assert old.get("job-legacy").spec_sha256 == hashlib.sha256(stored).hexdigest()
        # New rows in the old table keep the digest too (its old column left empty).
        added = old.add(job_id="job-new", tenant="prod", priority="high", gpus=16,
                        request=seed_body, spec_sha256="ab" * 32)
        assert added.spec_sha256 == "ab" * 32 and added.legacy_spec is None
    finally:
        old.close()
