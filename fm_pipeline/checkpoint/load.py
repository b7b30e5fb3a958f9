"""Load a checkpoint into any topology: fetch what is missing, verify while reading, reshard.

    result = restore_latest(app_state, job, store=store, root=root)  # all ranks; None: fresh
    result = restore(app_state, ref, job=job)               # a given checkpoint

Collective: every rank calls it with the same checkpoint. Each copy of the local tier (one per
node with its own disk, one in all for a shared filesystem, see shared_dirs.py) must hold every
file, because DCP resharding may read any rank's file: a remote checkpoint is downloaded
once per copy, and a local one whose copy lacks files (written by other nodes) gets them
from the store; each fetched file is checked against the manifest. DCP then reads each file
once (reader.py), computing its checksum from the bytes it loads, into whatever mesh
`app_state` was built on (resharding), optimizer state and data-loader cursor included.

Verification happens while the bytes land in the live tensors. On a mismatch the load
fails on every rank before any Stateful part's load_state_dict runs, and restore raises
CheckpointInvalid naming the files; the tensors may be partly overwritten, so the caller
must not train on (restore_latest loads an older checkpoint over them, or raises).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed.checkpoint as dcp

from fm_pipeline.catalog.manifest import Manifest, parse_manifest
from fm_pipeline.catalog.refs import (
    MANIFEST,
    CheckpointRef,
    local_tier,
    step_dir_name,
    store_root,
)
from fm_pipeline.catalog.supersede import supersede_newer
from fm_pipeline.catalog.tiering import complete_from_store, missing_files
from fm_pipeline.catalog.validate import (
    CheckpointInvalid,
    Problem,
    candidates,
    model_problems,
    read_manifest,
    validate,
)
from fm_pipeline.catalog.validity import record_invalid
from fm_pipeline.checkpoint import comm
from fm_pipeline.checkpoint.shared_dirs import Copies, discover_copies
from fm_pipeline.checkpoint.reader import VerifyingReader
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)


@dataclass
class RestoreResult:
    step: int
    tokens_seen: int
    source: str  # where it was restored from (a path or a store URI)
    local_path: str
    manifest: Manifest
    data_cursor: dict | None
    download_s: float
    verify_s: float  # hashing inside the load (overlapped with it, part of load_s)
    load_s: float  # DCP load, checksums verified on the way
    skipped: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.download_s + self.load_s

    @property
    def bytes_per_s(self) -> float:
        return self.manifest.total_bytes / self.seconds if self.seconds > 0 else 0.0


def _local_dir(ref: CheckpointRef, cache_root: Path | None) -> Path:
    return ref.dir if ref.is_local else local_tier(cache_root) / ref.name


def localize(ref: CheckpointRef, *, cache_root: Path | None = None,
             store: ObjectStore | None = None, job_name: str | None = None,
             copies: Copies | None = None) -> tuple[CheckpointRef, float]:
    """The checkpoint as a complete local directory on every copy of the local tier, and the
    seconds spent fetching. Collective. A remote checkpoint is fetched into `cache_root`
    (default: the job's local tier), files already there and intact are kept; a local one
    whose copy lacks files gets them from `store` (the job's checkpoint of the same step)."""
    dest = _local_dir(ref, cache_root)
    copies = copies or discover_copies(dest.parent)
    t0 = time.perf_counter()
    expected = None
    if ref.is_local and not copies.shared:  # other copies check against rank 0's manifest
        expected = _rank0_manifest_bytes(ref)
    error = None
    if copies.leader:
        try:
            if not ref.is_local:
                complete_from_store(ref, dest, verify_present=True)
            else:
                _complete_local(ref, dest, expected, store=store, job_name=job_name)
        except CheckpointInvalid as e:
            error = [(p.where, p.message, p.kind) for p in e.problems]
        except (StoreError, OSError, ValueError) as e:  # every rank must reach the gather
            error = [(ref.location, f"cannot fetch the checkpoint: {e}", "unreachable")]
    errors = [e for e in comm.all_gather(error) if e is not None]
    if errors:
        raise CheckpointInvalid(ref, [Problem(*p) for probs in errors for p in probs])
    return CheckpointRef.local(dest), time.perf_counter() - t0


def _rank0_manifest_bytes(ref: CheckpointRef) -> bytes:
    """Rank 0's manifest on every rank (collective), or FileNotFoundError on every rank."""
    box = None
    if comm.rank() == 0:
        try:
            box = (ref.read_bytes(MANIFEST), None)
        except (OSError, StoreError) as e:
            box = (None, f"{ref.location}: no readable {MANIFEST} on rank 0: {e}")
    data, error = comm.broadcast_from_rank0(box)
    if error is not None:
        raise FileNotFoundError(error)
    return data


def _complete_local(ref: CheckpointRef, dest: Path, expected: bytes | None, *,
                    store: ObjectStore | None, job_name: str | None) -> None:
    """Fetch from the store the files this copy lacks (sizes only: the load verifies the
    files that are here as it reads them)."""
    if store is None or job_name is None:
        return  # nothing to fetch from: what is missing is reported by the load, by name
    data = expected if expected is not None else ref.read_bytes(MANIFEST)
    manifest = parse_manifest(data, where=ref.location)
    missing = missing_files(dest, manifest)
    if not missing:
        return
    remote = CheckpointRef.remote(store, f"{store_root(job_name)}/{ref.name}")
    try:
        if not remote.has(MANIFEST):
            return  # not in the store: the load reports the missing files
    except StoreError:
        return
    log.info("%s lacks %d file(s) of the checkpoint; fetching them from %s", dest,
             len(missing), remote.location)
    complete_from_store(remote, dest, expect_manifest=data, verify_present=False)


BeforeLoad = Callable[[Manifest], ContextManager]  # wraps the load, e.g. RNG per topology


def restore(app_state: dict, ref: CheckpointRef, *, job=None, verify: bool = True,
            cache_root: Path | None = None, store: ObjectStore | None = None,
            before_load: BeforeLoad | None = None) -> RestoreResult:
    """Load `ref` into the Stateful parts of `app_state` (all ranks). Raises CheckpointInvalid
    (naming files/fields) when the checkpoint is corrupt or belongs to another model; the
    state may then be partly overwritten and must not be used. `store`: where a copy that
    lacks files (nodes with their own disks) fetches them. `before_load(manifest)`: a context
    manager around the load, given the checkpoint's manifest (the trainer asks for per-rank
    RNG states only from its own topology). Every rank raises when any rank failed."""
    copies = discover_copies(_local_dir(ref, cache_root).parent)
    local, download_s = localize(ref, cache_root=cache_root, store=store,
                                 job_name=job.name if job is not None else None, copies=copies)
    if copies.shared:
        manifest = read_manifest(local)
    else:  # a copy may still lack its manifest (nothing to fetch it from): rank 0's is the one
        manifest = parse_manifest(_rank0_manifest_bytes(local), where=local.location)
    if problems := model_problems(manifest, job):
        raise CheckpointInvalid(ref, problems)
    absent = sorted(set(app_state) - set(manifest.state_keys))
    if absent:
        raise ValueError(f"checkpoint {ref.location} has no state for {absent}; it holds "
                         f"{manifest.state_keys}")
    reader = VerifyingReader(local.dir, manifest if verify else None, copy_key=copies.key)
    t0 = time.perf_counter()
    load_error = None
    try:  # one intra-op thread: the copies are memory-bound and share the cores
        with comm.quiet_single_process(), comm.intra_op_threads(1), \
                (before_load(manifest) if before_load else contextlib.nullcontext()):
            dcp.load(app_state, storage_reader=reader, no_dist=not comm.initialized())
    except (Exception, dcp.api.CheckpointException) as e:  # a BaseException
        load_error = e
    load_s = time.perf_counter() - t0
    gathered = comm.all_gather((reader.problems, reader.verified,
                                None if load_error is None else f"{type(load_error).__name__}: "
                                                                f"{load_error}"))
    problems = list(dict.fromkeys(p for ps, _, _ in gathered for p in ps))
    if problems:
        raise CheckpointInvalid(ref, problems)
    if load_error is not None:
        raise load_error
    failed = [(rank, error) for rank, (_, _, error) in enumerate(gathered) if error]
    if failed:  # another rank's load failed: this rank's state is not to be trained on
        raise RuntimeError(f"restore of {ref.location} failed on rank {failed[0][0]}: "
                           f"{failed[0][1]}")
    unverified = set(manifest.file_map()) - {n for _, names, _ in gathered for n in names}
    if verify and unverified:  # the reader's plan must cover every file
        raise RuntimeError(f"restore of {ref.location} left {sorted(unverified)} unverified")
    result = RestoreResult(
        step=manifest.step, tokens_seen=manifest.tokens_seen, source=ref.location,
        local_path=str(local.dir), manifest=manifest, data_cursor=manifest.data.cursor,
        download_s=download_s, verify_s=reader.hash_s, load_s=load_s)
    log.info("restored step %d from %s (%.1f MB in %.2fs: download %.2fs, load %.2fs with "
             "checksums)", result.step, ref.location, manifest.total_bytes / 1e6,
             result.seconds, download_s, load_s)
    return result


class NoRestorableCheckpoint(ValueError):
    """Committed checkpoints exist but none restores: starting from scratch would be wrong."""


def restore_latest(app_state: dict, job, *, store: ObjectStore | None = None,
                   root: Path | None = None, verify: bool = True,
                   before_load: BeforeLoad | None = None) -> RestoreResult | None:
    """Newest checkpoint of `job` that restores, local tier first at equal steps; corrupt or
    unreachable ones are skipped with the reason. None if the job has no committed checkpoint
    (a fresh start); NoRestorableCheckpoint if it has some and none restores."""
    listed, skipped, committed = None, [], False
    if comm.rank() == 0:
        listed = []
        unreachable: list[str] = []
        for ref in candidates(job.name, store=store, root=root, unreachable=unreachable):
            problems = validate(ref, job, checksums=False)
            try:
                committed |= ref.has(MANIFEST)
            except StoreError:
                pass
            if problems and _fetchable(ref, problems, store, job.name):
                problems = []  # this node lacks files other nodes wrote; the store has them
            if problems:
                skipped.append(f"{ref.location}: " + "; ".join(map(str, problems)))
            else:
                listed.append((ref.step, "local" if ref.is_local else "store"))
        skipped += [f"{where} (store unreachable)" for where in unreachable]
        for line in skipped:  # said whether or not an older one then restores
            log.warning("skipping checkpoint %s", line)
    listed, skipped, committed = comm.broadcast_from_rank0((listed, skipped, committed))
    for step, tier in listed:
        if tier == "local":
            ref = CheckpointRef.local(local_tier(root) / step_dir_name(step))
        else:
            ref = CheckpointRef.remote(store, f"{store_root(job.name)}/{step_dir_name(step)}")
        try:
            result = restore(app_state, ref, job=job, verify=verify, cache_root=root,
                             store=store, before_load=before_load)
        except CheckpointInvalid as e:
            log.warning("cannot restore %s, trying an older one: %s", ref.location, e)
            skipped.append(f"{ref.location}: " + "; ".join(map(str, e.problems)))
            if comm.rank() == 0 and not any(p.kind == "unreachable" for p in e.problems):
                record_invalid(ref, e.problems)  # no later look selects it again
            continue
        result.skipped = skipped
        return result
    if committed:
        raise NoRestorableCheckpoint(
            f"job {job.name!r} has committed checkpoints but none restores (the model state "
            "may be partly overwritten):\n" + "\n".join(f"  - {line}" for line in skipped))
    return None


def _fetchable(ref: CheckpointRef, problems: list[Problem], store, job_name: str) -> bool:
    """A local checkpoint whose only problem is files absent here, committed in the store."""
    if not ref.is_local or store is None or any(p.kind != "missing" for p in problems):
        return False
    try:
        return store.exists(f"{store_root(job_name)}/{ref.name}/{MANIFEST}")
    except StoreError:
        return False


def _marked_invalid(ref: CheckpointRef) -> str | None:
    """What a failed restore recorded against this very checkpoint (validity.py), or None."""
    from fm_pipeline.catalog.validate import invalid_reason

    try:
        return invalid_reason(ref, ref.read_bytes(MANIFEST))
    except (FileNotFoundError, StoreError):
        return None  # no manifest: the restore itself names that


def resume(app_state: dict, job, *, store: ObjectStore, root: Path | None = None,
           resume_from: CheckpointRef | None = None,
           before_load: BeforeLoad | None = None) -> RestoreResult | None:
    """What a segment restores before its first step (all ranks): the newest checkpoint of
    the job that restores (None on a fresh start), or `resume_from`. Resuming from an older
    checkpoint of the job is a rollback: once every rank restored it, rank 0 supersedes the
    job's newer checkpoints in both tiers (supersede.py) so no discovery selects the abandoned
    continuation; a tier that cannot record it stops the segment before any step."""
    if resume_from is None:
        return restore_latest(app_state, job, store=store, root=root,
                              before_load=before_load)
    if (why := _marked_invalid(resume_from)) is not None:  # named by hand, still refused
        raise CheckpointInvalid(resume_from, [Problem("invalid", why, kind="invalid")])
    result = restore(app_state, resume_from, job=job, store=store, cache_root=root,
                     before_load=before_load)
    error = None
    if comm.rank() == 0 and result.manifest.job == job.name:
        try:
            local = CheckpointRef.local(result.local_path)
            superseded = supersede_newer(job.name, resume_from, local.read_bytes(MANIFEST),
                                         root=local_tier(root), store=store)
            if superseded:
                log.warning("resumed job %s from step %d: %d newer checkpoint(s) superseded",
                            job.name, resume_from.step, len(superseded))
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    error = comm.broadcast_from_rank0(error)
    if error is not None:
        raise RuntimeError(f"resumed from {resume_from.location} but could not supersede the "
                           f"job's newer checkpoints, so they would still be selected: {error};"
                           " nothing was trained, retry when every tier is reachable")
    return result
