"""One live segment per job: a lease that the trainer's rank 0 holds in both tiers.

    lease = JobLease(job.name, store=store, ttl_s=30, run_dir=runs).acquire()   # LeaseHeld names the holder
    lease.start_heartbeat(on_lost=stop_training)                   # renews every ttl/3
    lease.confirm()                                                # before a commit: still ours?
    lease.release()

Local tier: `runs/<job>/lease.lock` is flock'd for the holder's whole life (the kernel drops
the lock when the process dies, however it dies) and `runs/<job>/lease.json` says who holds
it. Store tier: `checkpoints/<job>/lease.json`, written only with conditional puts: created
with If-None-Match, renewed and released with If-Match on the holder's own etag, so two
writers can never both believe they hold it (S3 conditional writes; LocalStore serialises
them with an flock). A record carries holder id, host, pid, start, heartbeat and expiry.

Taking a held lease: a holder on this host is refused at once while its process runs, and
taken over at once when it is gone. A holder on another host is watched until it renews
(alive: refused, naming it; at most one renewal interval) or stays silent for its whole TTL
(taken over), so a segment that replaces a crashed one elsewhere (a new pod) waits instead of
failing. Silence is observed, never computed from timestamps: the contender times the
unchanged lease object on its own monotonic clock, as Kubernetes leader election does, so
a host whose wall clock is off by minutes neither takes a live lease nor waits forever.
The assumption that remains: the hosts' clocks run at nearly the same rate (a holder
renews every TTL/3 by its clock; a contender gives it a whole TTL by its own). The new record keeps the previous holder under `taken_over`. A store that does not
answer is retried for one TTL, then the segment fails (retryable). While training, an
unreachable store only delays the renewal (nobody else can take the lease without the store
either); a renewal refused because someone else now holds it means the lease is lost: the
holder must stop and commit nothing more.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from fm_pipeline.storage import ObjectNotFound, ObjectStore, PreconditionFailed, StoreError
from fm_pipeline.storage.durable import atomic_write

log = logging.getLogger(__name__)

FORMAT = "fm-lease/1"
LOCAL_LOCK, LOCAL_RECORD = "lease.lock", "lease.json"


def store_key(job_name: str) -> str:
    return f"checkpoints/{job_name}/lease.json"


class LeaseHeld(RuntimeError):
    """Another live segment of the job holds its lease; this one must not start."""

    def __init__(self, job_name: str, holder: dict, where: str, now: float):
        self.holder = holder
        super().__init__(f"job {job_name} is already being trained: {describe(holder, now)} "
                         f"holds its lease ({where}); stop that segment or wait for it to end")


class LeaseLost(RuntimeError):
    """The lease was taken over (this holder looked dead): commit nothing more, stop."""


class LeaseUnavailable(RuntimeError):
    """The store did not answer for a whole TTL: whether another segment is live is unknown."""


class StoreIgnoresConditions(RuntimeError):
    """The store accepted a conditional write that must fail: two trainers could both take
    the lease there. Nothing runs on it (a bad config, not retried)."""


_PROBED: dict[str, None] = {}  # store URIs whose conditional writes were seen to hold


def probe_conditional_writes(store: ObjectStore, job_name: str) -> None:
    """Once per store and process: a create over an existing object (If-None-Match) and a
    replace with a wrong etag (If-Match) must both be refused, or StoreIgnoresConditions
    names the store. A StoreError (unreachable) passes through: the acquire retries it."""
    if store.uri in _PROBED:
        return
    key = f"checkpoints/{job_name}/lease-probe-{uuid.uuid4().hex[:12]}.json"
    store.put_if(b'{"probe": "conditional writes"}\n', key, etag=None)
    ignored = []
    try:
        for what, condition in (("If-None-Match: * over an existing object", None),
                                ("If-Match with a wrong etag", '"0000-not-its-etag"')):
            try:
                store.put_if(b'{"probe": "must be refused"}\n', key, etag=condition)
                ignored.append(what)
            except PreconditionFailed:
                pass
    finally:
        try:
            store.delete(key)
        except StoreError:
            log.warning("lease probe %s left in %s", key, store.uri)
    if ignored:
        raise StoreIgnoresConditions(
            f"the object store {store.uri} accepted writes it had to refuse "
            f"({'; '.join(ignored)}): it ignores S3 conditional writes, so the job's lease "
            "cannot keep two trainers apart there. Use a store that honours If-None-Match and "
            "If-Match (AWS S3, recent MinIO, ...) or a local directory")
    _PROBED[store.uri] = None


def describe(holder: dict, now: float) -> str:
    beat = holder.get("heartbeat_at")
    age = f", heartbeat {now - beat:.0f} s ago" if isinstance(beat, (int, float)) else ""
    return (f"holder {holder.get('holder', '?')} on {holder.get('host', '?')} "
            f"(pid {holder.get('pid', '?')}, since {holder.get('started_at_iso', '?')}{age})")


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True
    return True


def _holder_ttl(holder: dict, default: float) -> float:
    """The TTL the holder promised to renew within (its record's), else ours."""
    ttl = holder.get("ttl_s")
    return float(ttl) if isinstance(ttl, (int, float)) and 0 < ttl <= 3600 else default


class JobLease:
    def __init__(self, job_name: str, *, store: ObjectStore | None, ttl_s: float = 30.0,
                 run_dir: Path, clock: Callable[[], float] = time.time):
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        self.job_name, self.store, self.ttl_s, self.clock = job_name, store, ttl_s, clock
        self.run_dir = Path(run_dir)
        self.renew_every_s = ttl_s / 3
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.started_at = clock()
        self.taken_over: dict | None = None  # the previous holder, when this one took over
        self.lost: str | None = None
        self._lock_fd: int | None = None
        self._etag: str | None = None
        self._renewed_at = 0.0
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the record -------------------------------------------------------------------------

    def record(self) -> dict:
        now = self.clock()
        return {"format": FORMAT, "job": self.job_name, "holder": self.holder,
                "host": self.host, "pid": self.pid, "started_at": self.started_at,
                "started_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                time.gmtime(self.started_at)),
                "heartbeat_at": now, "expires_at": now + self.ttl_s, "ttl_s": self.ttl_s,
                "taken_over": self.taken_over}

    def _dead_here(self, holder: dict) -> bool:
        """A holder on this host whose process is gone (or whose flock this process got)."""
        if holder.get("host") != self.host:
            return False
        local = self.taken_over or {}
        return holder.get("holder") == local.get("holder") or not _pid_alive(holder.get("pid"))

    # -- acquire ----------------------------------------------------------------------------

    def acquire(self, *, wait: bool = True) -> JobLease:
        """Take the lease in both tiers (local first). Raises LeaseHeld, or LeaseUnavailable
        when the store cannot be asked. `wait`: watch a holder on another host until it
        renews (alive: refused) or stays silent for its TTL (taken over); without it, any
        holder not proven dead is refused at once."""
        self._acquire_local()
        try:
            if self.store is not None:
                self._probe_store()
                self._acquire_store(wait=wait)
            self._write_local()
        except BaseException:
            self._unlock_local()
            raise
        if self.taken_over:
            log.warning("job %s: took over the lease of %s", self.job_name,
                        describe(self.taken_over, self.clock()))
        return self

    def _acquire_local(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCAL_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self._read_local() or {"holder": "unknown (no lease.json yet)"}
            raise LeaseHeld(self.job_name, holder, str(self.run_dir / LOCAL_LOCK),
                            self.clock()) from None
        self._lock_fd = fd
        if (previous := self._read_local()) is not None:  # its holder died holding it
            self.taken_over = {**previous, "why": "its process ended without releasing it"}

    def _read_local(self) -> dict | None:
        try:
            return json.loads((self.run_dir / LOCAL_RECORD).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None

    def _write_local(self) -> None:
        atomic_write(self.run_dir / LOCAL_RECORD,
                     (json.dumps(self.record(), indent=2) + "\n").encode())

    def _probe_store(self) -> None:
        deadline = self.clock() + self.ttl_s
        while True:
            try:
                return probe_conditional_writes(self.store, self.job_name)
            except StoreError as e:
                deadline = self._unreachable(e, deadline)

    def _acquire_store(self, *, wait: bool) -> None:
        key, deadline = store_key(self.job_name), self.clock() + self.ttl_s
        watched: tuple[str, float] | None = None  # (etag, monotonic time first seen)
        while True:
            try:
                self._etag = self.store.put_if(self._encode(), key, etag=None)
                self._renewed_at = self.clock()
                return
            except PreconditionFailed:
                pass
            except StoreError as e:
                deadline = self._unreachable(e, deadline)
                continue
            try:
                data, etag = self.store.get_with_etag(key)
            except ObjectNotFound:
                continue  # released meanwhile: try to create it again
            except StoreError as e:
                deadline = self._unreachable(e, deadline)
                continue
            holder, now = self._parse(data), self.clock()
            if watched is None or watched[0] != etag:
                renewed = watched is not None  # the object changed while we watched
                watched = (etag, time.monotonic())
            else:
                renewed = False
            ttl = _holder_ttl(holder, self.ttl_s)
            silent = time.monotonic() - watched[1]
            if holder.get("unreadable"):
                why = "its lease object cannot be read (nobody can renew it)"
            elif self._dead_here(holder):
                why = "its process on this host is gone"
            elif (not wait or renewed or
                  (holder.get("host") == self.host and _pid_alive(holder.get("pid")))):
                # alive: it renewed while we watched, or its process is here and running
                raise LeaseHeld(self.job_name, holder, self.store.uri_of(key), now)
            elif silent >= ttl:
                why = (f"it did not renew for {silent:.1f} s, its whole TTL ({ttl:g} s), "
                       "timed on this host's monotonic clock")
            else:  # another host's holder, not yet proven alive: watch until it renews
                time.sleep(min(1.0, ttl - silent + 0.05))  # or stays silent for its TTL
                continue
            self.taken_over = {**holder, "why": why}
            try:
                self._etag = self.store.put_if(self._encode(), key, etag=etag)
                self._renewed_at = self.clock()
                return
            except PreconditionFailed:
                self.taken_over = None  # another taker won: look again
            except StoreError as e:
                deadline = self._unreachable(e, deadline)

    def _unreachable(self, error: StoreError, deadline: float) -> float:
        if self.clock() >= deadline:
            raise LeaseUnavailable(f"job {self.job_name}: the lease in {self.store.uri} could "
                                   f"not be checked for {self.ttl_s:.0f} s: {error}") from error
        time.sleep(min(1.0, self.ttl_s / 10))
        return deadline

    def _parse(self, data: bytes) -> dict:
        try:
            body = json.loads(data)
            if isinstance(body, dict) and body.get("format") == FORMAT:
                return body
        except ValueError:
            pass
        return {"holder": "unreadable lease object", "unreadable": True}  # nobody can renew it

    def _encode(self) -> bytes:
        return (json.dumps(self.record(), indent=2) + "\n").encode()

    # -- hold -------------------------------------------------------------------------------

    def confirm(self) -> None:
        """Renew now; raises LeaseLost if another holder took it. A store that does not answer
        raises StoreError (the caller's write to that store would fail the same way)."""
        with self._mutex:
            if self.lost:
                raise LeaseLost(self.lost)
            if self.store is None:
                return
            try:
                self._etag = self.store.put_if(self._encode(), store_key(self.job_name),
                                               etag=self._etag)
                self._renewed_at = self.clock()
            except (PreconditionFailed, ObjectNotFound):
                self.lost = self._lost_reason()
                raise LeaseLost(self.lost) from None

    def _lost_reason(self) -> str:
        try:
            data, _ = self.store.get_with_etag(store_key(self.job_name))
            now = describe(self._parse(data), self.clock())
        except StoreError:
            now = "nobody (the lease object is gone)"
        return (f"job {self.job_name}: the lease was taken over while this segment held it "
                f"(now held by {now}); this segment stops without committing")

    def start_heartbeat(self, *, on_lost: Callable[[str], None]) -> None:
        def beat():
            while not self._stop.wait(self.renew_every_s):
                try:
                    self.confirm()
                    self._write_local()
                except LeaseLost as e:
                    log.error("%s", e)
                    on_lost(str(e))
                    return
                except (StoreError, OSError) as e:  # keep training; the next beat retries
                    log.warning("job %s: lease not renewed (%.0f s since the last renewal): "
                                "%s", self.job_name, self.clock() - self._renewed_at, e)

        self._thread = threading.Thread(target=beat, name="fm-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Give the lease up in both tiers (store first); never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._mutex:
            if self.store is not None and self._etag is not None and not self.lost:
                try:
                    self.store.delete_if(store_key(self.job_name), etag=self._etag)
                except StoreError as e:  # it expires by itself
                    log.warning("job %s: lease not released in %s: %s", self.job_name,
                                self.store.uri, e)
            self._etag = None
        if self._lock_fd is not None:
            (self.run_dir / LOCAL_RECORD).unlink(missing_ok=True)
        self._unlock_local()

    def _unlock_local(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = None
