"""Local tier <-> object store: upload every file, then the manifest; download and verify.

    report = upload_checkpoint(local_ref, store, job_name="demo")  # committed remotely or not
    reports = sync_to_store("demo", store, root=root)              # retry whatever is pending
    ref = download_checkpoint(remote_ref, dest_dir)                # verified, manifest last

A checkpoint counts as committed in the store only once every file is uploaded and verified
(size, and the store's own content check: S3Store sends SHA-256 per part and verifies it) and then the manifest is uploaded and read back.
An outage at any point leaves no remote manifest, so discovery never selects the partial
upload, and nothing local is touched. The uploader records its outcome in `marks/upload.json`.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from fm_pipeline.catalog.set_aside import set_aside
from fm_pipeline.catalog.manifest import Manifest, atomic_write, entry_problem, fsync_dir
from fm_pipeline.catalog.marks import read_mark, write_mark
from fm_pipeline.catalog.refs import (
    MANIFEST,
    CheckpointRef,
    delete_checkpoint,
    is_content_file,
    job_of,
    list_local,
    local_tier,
    store_root,
)
from fm_pipeline.catalog.supersede import LedgerUnreadable, superseded_reason, superseded_steps
from fm_pipeline.catalog.validate import CheckpointInvalid, Problem, read_manifest, validate
from fm_pipeline.storage import ObjectNotFound, ObjectStore, StoreError

log = logging.getLogger(__name__)

UPLOAD_WORKERS = 4
# Verdicts about one copy's files (validity.py), not about the checkpoint: never uploaded.
_LOCAL_ONLY_MARKS = {"marks/verified.json", "marks/invalid.json"}


@dataclass
class UploadReport:
    step: int
    store_uri: str
    prefix: str
    committed: bool
    files: int
    bytes: int
    seconds: float
    error: str | None = None

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "bytes_per_s": round(self.bytes_per_s, 1)}


def upload_files(directory: Path, store: ObjectStore, prefix: str, names: list[str], *,
                 workers: int = UPLOAD_WORKERS) -> list[str]:
    """Upload `names` in parallel; the first failure stops the rest. Returns error messages."""
    if not names:
        return []

    def put(name: str) -> None:
        info = store.put_file(directory / name, f"{prefix}/{name}")
        size = (directory / name).stat().st_size
        if info.size != size:
            raise StoreError(f"upload of {store.uri_of(f'{prefix}/{name}')} stored {info.size} "
                             f"bytes, the file has {size}")

    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=min(workers, len(names)),
                            thread_name_prefix="fm-ckpt-upload") as pool:
        futures = {pool.submit(put, n): n for n in names}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        for f in list(done) + [f for f in pending if not f.cancelled()]:
            if (exc := f.exception()) is not None:
                errors.append(f"{futures[f]}: {exc}")
    return errors


def commit_remote(store: ObjectStore, prefix: str, manifest: Manifest, manifest_bytes: bytes):
    """Check every file landed with its size, then upload the manifest and read it back."""
    remote = {i.key[len(prefix) + 1:]: i.size for i in store.list(f"{prefix}/")}
    for entry in manifest.files:
        if remote.get(entry.path) != entry.size:
            raise StoreError(f"{store.uri_of(f'{prefix}/{entry.path}')}: expected "
                             f"{entry.size} bytes, the store has {remote.get(entry.path)}")
    store.put_bytes(manifest_bytes, f"{prefix}/{MANIFEST}")
    if store.get_bytes(f"{prefix}/{MANIFEST}") != manifest_bytes:
        raise StoreError(f"{store.uri_of(f'{prefix}/{MANIFEST}')} did not read back identical")


def remote_prefix(job_name: str, ref: CheckpointRef) -> str:
    return f"{store_root(job_name)}/{ref.name}"


def is_committed_remotely(store: ObjectStore, job_name: str, ref: CheckpointRef) -> bool:
    """The store holds this very checkpoint (the same manifest), not just one of its step:
    after a rollback the store may still hold the superseded checkpoint of the step."""
    try:
        remote = store.get_bytes(f"{remote_prefix(job_name, ref)}/{MANIFEST}")
    except ObjectNotFound:
        return False
    return remote == ref.read_bytes(MANIFEST)


def clear_remote_step(store: ObjectStore, prefix: str, manifest_bytes: bytes) -> None:
    """Before uploading a checkpoint: empty its prefix unless it already holds this very
    checkpoint, so no stale file of another one is left to fail validation as an extra file.
    A committed one is set aside with its reason (set_aside.py); a half upload is deleted."""
    head = f"{prefix}/"
    if not any(True for _ in store.list(head)):
        return
    try:
        old = store.get_bytes(f"{prefix}/{MANIFEST}")
    except ObjectNotFound:
        old = None
    if old == manifest_bytes:
        return
    ref = CheckpointRef.remote(store, prefix)
    if old is None:  # never committed: nothing of value, nothing to keep
        log.info("%s holds an incomplete upload; removing it first", store.uri_of(prefix))
        delete_checkpoint(ref)
        return
    if (why := superseded_reason(ref, old)) is not None:
        set_aside(ref, kind="superseded", reason=why)
        return
    problems = validate(ref, checksums=False)
    found = "; ".join(map(str, problems)) if problems else "it validated structurally"
    set_aside(ref, kind="invalid" if problems else "replaced",
              reason=f"another checkpoint of this step ({found}); a new save took its place")


def upload_checkpoint(local: CheckpointRef, store: ObjectStore, *, job_name: str,
                      verify_local: bool = True) -> UploadReport:
    """Upload a committed local checkpoint; never raises for store outages (see the report).

    With `verify_local` the local files are checked against the manifest first, so a
    corrupted local copy is refused instead of being committed remotely."""
    assert local.dir is not None, "upload_checkpoint takes a local checkpoint"
    prefix = remote_prefix(job_name, local)
    t0 = time.perf_counter()
    manifest = read_manifest(local)
    if verify_local and (problems := validate(local)):
        raise CheckpointInvalid(local, problems)
    names = [f.path for f in manifest.files]
    nbytes = manifest.total_bytes
    try:
        clear_remote_step(store, prefix, local.read_bytes(MANIFEST))
        errors = upload_files(local.dir, store, prefix, names)
    except StoreError as e:
        errors = [f"clearing {store.uri_of(prefix)}: {e}"]
    if not errors:
        try:
            commit_remote(store, prefix, manifest, local.read_bytes(MANIFEST))
        except StoreError as e:
            errors.append(str(e))
    report = UploadReport(step=local.step, store_uri=store.uri, prefix=prefix,
                          committed=not errors, files=len(names), bytes=nbytes,
                          seconds=time.perf_counter() - t0,
                          error="; ".join(errors) if errors else None)
    record_upload(local, report, store)
    return report


def record_upload(local: CheckpointRef, report: UploadReport, store: ObjectStore) -> None:
    """Write marks/upload.json locally and, once committed, copy the local marks up too."""
    previous = read_mark(local, "upload") or {}
    attempts = int(previous.get("attempts", 0)) + 1
    write_mark(local, "upload", {**report.as_dict(), "attempts": attempts})
    if report.committed:
        log.info("checkpoint %s committed to %s in %.2fs (%.1f MB/s)", local.name,
                 store.uri_of(report.prefix), report.seconds, report.bytes_per_s / 1e6)
        for name, size in local.files().items():
            if name.startswith("marks/") and size and name not in _LOCAL_ONLY_MARKS:
                try:
                    store.put_file(local.dir / name, f"{report.prefix}/{name}")
                except StoreError as e:  # marks are advisory; the checkpoint is committed
                    log.warning("could not upload %s: %s", name, e)
    else:
        log.warning("checkpoint %s NOT committed to %s (attempt %d): %s; the local copy is "
                    "intact and will be retried", local.name, store.uri, attempts, report.error)


def pending_uploads(job_name: str, store: ObjectStore, *, root: Path | None = None):
    """Committed local checkpoints without a remote manifest, newest first."""
    out = []
    committed = [r for r in list_local(local_tier(root)) if r.has(MANIFEST)]
    try:
        superseded = superseded_steps(committed)
    except LedgerUnreadable as e:
        log.error("no uploads: %s", e)
        return []
    for ref in reversed(committed):
        if ref.step in superseded:
            continue  # abandoned by a rollback: not worth a place in the store
        mark = read_mark(ref, "upload")
        if mark and mark.get("committed") and mark.get("store_uri") == store.uri:
            continue
        if not is_committed_remotely(store, job_name, ref):
            out.append(ref)
    return out


def sync_to_store(job_name: str, store: ObjectStore, *, root: Path | None = None,
                  exclude_steps: set[int] = frozenset()) -> list[UploadReport]:
    """Upload every pending local checkpoint, newest first; stops at the first failure."""
    reports = []
    try:
        pending = pending_uploads(job_name, store, root=root)
    except StoreError as e:
        log.warning("cannot check pending uploads in %s: %s", store.uri, e)
        return reports
    for ref in pending:
        if ref.step in exclude_steps:
            continue
        try:
            report = upload_checkpoint(ref, store, job_name=job_name)
        except CheckpointInvalid as e:
            log.error("not uploading %s: %s", ref.location, e)
            continue
        reports.append(report)
        if not report.committed:
            break
    return reports


def missing_files(directory: Path, manifest: Manifest) -> list[str]:
    """Files of the manifest that are absent from `directory` or have another size."""
    out = []
    for entry in manifest.files:
        try:
            if (directory / entry.path).stat().st_size == entry.size:
                continue
        except FileNotFoundError:
            pass
        out.append(entry.path)
    return out


def download_checkpoint(remote: CheckpointRef, dest: Path) -> CheckpointRef:
    """Fetch a remote checkpoint into `dest` (a step-XXXXXXXX directory), verified: files
    already there and intact are kept, the others fetched and checked, the manifest last."""
    return complete_from_store(remote, dest, verify_present=True)


def complete_from_store(remote: CheckpointRef, dest: Path, *, verify_present: bool,
                        expect_manifest: bytes | None = None) -> CheckpointRef:
    """Make `dest` a complete copy of the remote checkpoint, fetching only what it lacks.

    Present files must have the manifest's size (and checksum, with `verify_present`) or are
    fetched again; unlisted files are removed; each fetched file is written under a temporary
    name, checked against the manifest and renamed into place; the manifest comes last, so
    an interrupted fetch never looks committed. `expect_manifest`: the bytes the local copy's
    manifest has; the store's must be the same checkpoint."""
    assert remote.store is not None, "complete_from_store takes a remote checkpoint"
    dest = Path(dest)
    manifest_bytes = remote.read_bytes(MANIFEST)
    if expect_manifest is not None and manifest_bytes != expect_manifest:
        raise CheckpointInvalid(remote, [Problem(
            MANIFEST, "differs from the local copy's manifest: the store holds another "
                      "checkpoint of this step")])
    manifest = read_manifest(remote)
    local_manifest = dest / MANIFEST
    if local_manifest.is_file() and local_manifest.read_bytes() != manifest_bytes:
        # Another checkpoint of this step (an older run): keep it aside, never mix the two.
        aside = dest.with_name(f".{dest.name}.replaced-{uuid.uuid4().hex[:8]}")
        os.rename(dest, aside)
        log.warning("%s held another checkpoint of this step; moved to %s", dest, aside)
    dest.mkdir(parents=True, exist_ok=True)
    listed = manifest.file_map()
    for p in dest.iterdir():
        if p.is_file() and is_content_file(p.name) and p.name not in listed:
            log.warning("removing %s: not part of the checkpoint in %s", p, remote.location)
            p.unlink()
    fetch = set(missing_files(dest, manifest))
    if verify_present:
        for entry in manifest.files:
            if entry.path not in fetch and (why := entry_problem(dest / entry.path, entry)):
                log.warning("local copy of %s is bad (%s); fetching it again",
                            dest / entry.path, why)
                fetch.add(entry.path)

    def get(entry) -> Problem | None:
        tmp = dest / f".{entry.path}.download-{uuid.uuid4().hex[:8]}.tmp"
        try:
            remote.store.get_file(f"{remote.prefix}/{entry.path}", tmp)
            if problem := entry_problem(tmp, entry):
                return Problem(entry.path, f"after download: {problem}")
            os.replace(tmp, dest / entry.path)
            return None
        finally:
            tmp.unlink(missing_ok=True)

    entries = [listed[n] for n in sorted(fetch)]
    if entries:
        with ThreadPoolExecutor(max_workers=UPLOAD_WORKERS) as pool:
            problems = [p for p in pool.map(get, entries) if p is not None]
        if problems:
            raise CheckpointInvalid(remote, problems)
    if not local_manifest.is_file():
        atomic_write(local_manifest, manifest_bytes)  # the copy is complete: commit it
    else:
        fsync_dir(dest)
    if verify_present:  # every file was checked or fetched: an old verdict no longer holds
        (dest / "marks" / "invalid.json").unlink(missing_ok=True)
    return CheckpointRef.local(dest)


def local_copy(ref: CheckpointRef, *, site) -> tuple[CheckpointRef, float]:
    """For one process of the control side (an evaluation or drill launching its workers):
    the checkpoint as a complete local directory and the seconds spent fetching. A local
    ref is used as it is (the workers verify it while restoring); a store ref is fetched
    into its job's local tier at `site` (config.site), keeping files already there intact.
    Inside a training job, checkpoint.load.localize does this collectively."""
    if ref.is_local:
        return ref, 0.0
    dest = site.checkpoints_dir(job_of(ref)) / ref.name
    t0 = time.perf_counter()
    try:
        complete_from_store(ref, dest, verify_present=True)
    except (StoreError, OSError) as e:
        raise CheckpointInvalid(ref, [Problem(ref.location, f"cannot fetch the checkpoint: {e}",
                                              kind="unreachable")]) from None
    return CheckpointRef.local(dest), time.perf_counter() - t0
