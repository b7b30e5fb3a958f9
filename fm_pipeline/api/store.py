"""The queue's own state: what was submitted, by whom, in which order, and what happened
to it in the queue. Run state (started, ended, why) belongs to the orchestrator and
progress to the job's checkpoints and metrics; this store never caches either.

One SQLite file, `<site home>/api/queue.db` (queue_db_path). With the Dagster orchestrator
these records map onto run tags (tenant, priority, seq). The job spec itself lives once, in
the object store's registry (orchestration.registry); a row keeps its sha256 (spec_sha256),
so a spec changed behind the queue's back is refused at launch, not trained. Several API
processes may share it: `exclusive()` serialises their read-decide-write sections (an flock
on queue.db.lock), and each statement waits out another process's write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fm_pipeline.config.site import Site

# queued: waiting in the policy's queue; admitted: handed to the orchestrator;
# done: not in the queue any more (its runs say how it ended, or it was cancelled queued).
QueueState = Literal["queued", "admitted", "done"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT UNIQUE NOT NULL,
    tenant TEXT NOT NULL,
    priority TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    request TEXT NOT NULL,
    spec_sha256 TEXT,
    submitted_at REAL NOT NULL,
    queue_state TEXT NOT NULL,
    stop_requested TEXT,
    cancelled_at REAL,
    resume_checkpoint TEXT
);
CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs (tenant);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id);
CREATE TABLE IF NOT EXISTS idempotency (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (tenant, key)
);
"""


@dataclass(frozen=True)
class JobRecord:
    seq: int
    job_id: str
    tenant: str
    priority: str
    gpus: int
    request: dict
    spec_sha256: str | None  # of the registered spec; None: a row from before (legacy_spec)
    submitted_at: float
    queue_state: QueueState
    stop_requested: str | None  # "preempt" or "cancel" while the run stops
    cancelled_at: float | None
    resume_checkpoint: str | None
    legacy_spec: dict | None = None  # the full spec a queue.db from before kept in the row


def queue_db_path(site: Site) -> Path:
    return site.api_dir / "queue.db"


class JobStore:
    def __init__(self, path: Path):
        self.path = Path(path)  # queue_db_path(site)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._exclusive = threading.RLock()
        self._depth, self._fd = 0, None
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._legacy = self._migrate()
        self._version = None

    def _migrate(self) -> bool:
        """A queue.db written before the spec moved to the registry: its rows keep their full
        spec (`spec`), read as legacy_spec until the control plane registers it; new rows
        keep the digest only. True when the table has the old column."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
        if "spec_sha256" not in columns:
            self._db.execute("ALTER TABLE jobs ADD COLUMN spec_sha256 TEXT")
        return "spec" in columns

    def changed_elsewhere(self) -> bool:
        """Another connection (another process) committed since the last call (sqlite's
        data_version); True on the first call."""
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
        changed, self._version = version != self._version, version
        return changed

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def exclusive(self):
        """Hold the queue against every other thread and process (re-entrant in a thread);
        yields True in the outermost hold, where state cached from the store is re-read."""
        with self._exclusive:
            if self._depth == 0:
                self._fd = os.open(self.path.with_name(self.path.name + ".lock"),
                                   os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield self._depth == 1
            finally:
                self._depth -= 1
                if self._depth == 0:
                    os.close(self._fd)  # closing the descriptor releases the flock
                    self._fd = None

    def add(self, *, job_id: str, tenant: str, priority: str, gpus: int, request: dict,
            spec_sha256: str, submitted_at: float | None = None) -> JobRecord:
        legacy = ", spec" if self._legacy else ""  # the old NOT NULL column: left empty
        with self._lock:
            self._db.execute(
                f"INSERT INTO jobs (job_id, tenant, priority, gpus, request, spec_sha256{legacy},"
                f" submitted_at, queue_state) VALUES (?, ?, ?, ?, ?, ?{', ?' if legacy else ''},"
                " ?, 'queued')",
                (job_id, tenant, priority, gpus, json.dumps(request), spec_sha256,
                 *(("",) if legacy else ()),
                 submitted_at if submitted_at is not None else time.time()),
            )
        return self.get(job_id)

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _record(row) if row else None

    def list(self, *, tenant: str | None = None, queue_state: str | None = None) -> list[JobRecord]:
        query, args = "SELECT * FROM jobs WHERE 1=1", []
        if tenant is not None:
            query, args = query + " AND tenant = ?", [*args, tenant]
        if queue_state is not None:
            query, args = query + " AND queue_state = ?", [*args, queue_state]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY seq", args).fetchall()
        return [_record(r) for r in rows]

    def update(self, job_id: str, **fields) -> JobRecord:
        allowed = {"queue_state", "stop_requested", "cancelled_at", "resume_checkpoint",
                   "spec_sha256"}
        assert set(fields) <= allowed, set(fields) - allowed
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {sets} WHERE job_id = ?", [*fields.values(), job_id])
        return self.get(job_id)

    def idempotent(self, tenant: str, key: str, *, since: float) -> tuple[str, str] | None:
        """(job_id, body_sha256) of the tenant's submission under `key` made after `since`."""
        with self._lock:
            row = self._db.execute(
                "SELECT job_id, body_sha256 FROM idempotency WHERE tenant = ? AND key = ? "
                "AND at >= ?", (tenant, key, since)).fetchone()
        return (row["job_id"], row["body_sha256"]) if row else None

    def remember_idempotent(self, tenant: str, key: str, *, body_sha256: str, job_id: str,
                            at: float) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO idempotency (tenant, key, body_sha256, job_id, at) "
                "VALUES (?, ?, ?, ?, ?)", (tenant, key, body_sha256, job_id, at))

    def add_event(self, job_id: str, kind: str, detail: dict | None = None,
                  at: float | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                (job_id, at if at is not None else time.time(), kind, json.dumps(detail or {})),
            )

    def events(self, job_id: str) -> list[dict]:
        with self._lock:
            rows = self._db.execute(
                "SELECT at, kind, detail FROM events WHERE job_id = ? ORDER BY id", (job_id,)
            ).fetchall()
        return [{"at": r["at"], "kind": r["kind"], "detail": json.loads(r["detail"])} for r in rows]


def drain_tenant(store: JobStore, tenant: str, *, now: float | None = None) -> list[str]:
    """Cancel every queued job of `tenant` (one removed from the tenants file, say), under
    the queue's hold; running ones are left to end. Returns the job ids."""
    now = time.time() if now is None else now
    with store.exclusive():
        drained = [r.job_id for r in store.list(tenant=tenant, queue_state="queued")]
        for job_id in drained:
            store.update(job_id, queue_state="done", cancelled_at=now, resume_checkpoint=None)
            store.add_event(job_id, "cancelled", {"by": "fm api queue drain",
                                                  "reason": f"tenant {tenant} drained"}, at=now)
    return drained


def _record(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data["request"] = json.loads(data["request"])
    legacy = data.pop("spec", None)
    if legacy and not data["spec_sha256"]:
        data["legacy_spec"] = json.loads(legacy)
    return JobRecord(**data)
