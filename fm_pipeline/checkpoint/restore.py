"""Load a checkpoint into any topology: download if remote, verify, reshard, report.

    result = restore_latest(app_state, job, store=store)   # all ranks; None on a fresh start
    result = restore(app_state, ref, job=job)               # a given checkpoint

Collective: every rank calls it with the same checkpoint. A remote checkpoint is downloaded
once per node (local rank 0) into the local tier and checked file by file; the checksums of
a local one are verified with the work split across ranks. DCP then reads into whatever
mesh `app_state` was built on (resharding), optimizer state and data-loader cursor included.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed.checkpoint as dcp

from fm_pipeline.checkpoint import comm
from fm_pipeline.checkpoint.layout import (
    MANIFEST,
    CheckpointRef,
    local_root,
    step_dir_name,
    store_root,
)
from fm_pipeline.checkpoint.manifest import Manifest, entry_problem
from fm_pipeline.checkpoint.tiering import download_checkpoint
from fm_pipeline.checkpoint.validate import (
    CheckpointInvalid,
    Problem,
    model_problems,
    candidates,
    read_manifest,
    validate,
)
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
    verify_s: float
    load_s: float
    skipped: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.download_s + self.verify_s + self.load_s

    @property
    def bytes_per_s(self) -> float:
        return self.manifest.total_bytes / self.seconds if self.seconds > 0 else 0.0


def _job_of(ref: CheckpointRef) -> str:
    return ref.prefix.split("/")[-2]


def localize(ref: CheckpointRef, *, cache_root: Path | None = None) -> tuple[CheckpointRef, float]:
    """The checkpoint as a local directory (downloading once per node). Collective."""
    if ref.is_local:
        return ref, 0.0
    dest = Path(cache_root or local_root(_job_of(ref))) / ref.name
    t0 = time.perf_counter()
    error = None
    if comm.local_rank() == 0:
        try:
            download_checkpoint(ref, dest)
        except CheckpointInvalid as e:
            error = ("invalid", [(p.where, p.message) for p in e.problems])
        except (StoreError, FileNotFoundError, OSError) as e:
            error = ("unreachable", [(ref.location, str(e))])
    errors = [e for e in comm.all_gather(error) if e is not None]
    if errors:
        raise CheckpointInvalid(ref, [Problem(w, m) for _, probs in errors for w, m in probs])
    return CheckpointRef.local(dest), time.perf_counter() - t0


def verify_my_share(ref: CheckpointRef, manifest: Manifest) -> list[Problem]:
    """Size and checksum of this rank's share of the files (rank r takes every r-th)."""
    mine = sorted(manifest.files, key=lambda f: f.path)[comm.rank()::comm.world_size()]
    found = ((e.path, entry_problem(ref.dir / e.path, e)) for e in mine)
    return [Problem(path, msg) for path, msg in found if msg]


def restore(app_state: dict, ref: CheckpointRef, *, job=None, verify: bool = True,
            cache_root: Path | None = None) -> RestoreResult:
    """Load `ref` into the Stateful parts of `app_state` (all ranks). Raises CheckpointInvalid
    (naming files/fields) when the checkpoint is corrupt or belongs to another model; the
    state may then be partly overwritten and must not be used."""
    local, download_s = localize(ref, cache_root=cache_root)
    manifest = read_manifest(local)
    if problems := model_problems(manifest, job):
        raise CheckpointInvalid(ref, problems)
    absent = sorted(set(app_state) - set(manifest.state_keys))
    if absent:
        raise ValueError(f"checkpoint {ref.location} has no state for {absent}; it holds "
                         f"{manifest.state_keys}")
    t0 = time.perf_counter()
    # Checksums are verified while DCP loads (the second read of each byte hits the page
    # cache); the verdict is collected before anything is returned.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fm-ckpt-verify",
                            initializer=comm.single_threaded) as pool:
        verified = pool.submit(_timed, verify_my_share, local, manifest) if verify else None
        load_error = None
        try:  # one intra-op thread: the copies are memory-bound and share cores with verify
            with comm.quiet_single_process(), comm.intra_op_threads(1):
                dcp.load(app_state, checkpoint_id=str(local.dir), no_dist=not comm.initialized())
        except Exception as e:  # a corrupt file can break unpickling: report the cause
            load_error = e
        load_s = time.perf_counter() - t0
        mine, verify_s = verified.result() if verified else ([], 0.0)
    problems = [p for ps in comm.all_gather(mine) for p in ps]
    if problems:
        raise CheckpointInvalid(ref, problems)
    if load_error is not None:
        raise load_error
    result = RestoreResult(
        step=manifest.step, tokens_seen=manifest.tokens_seen, source=ref.location,
        local_path=str(local.dir), manifest=manifest, data_cursor=manifest.data.cursor,
        download_s=download_s, verify_s=verify_s, load_s=load_s)
    log.info("restored step %d from %s (%.1f MB in %.2fs: download %.2fs, verify %.2fs, "
             "load %.2fs)", result.step, ref.location, manifest.total_bytes / 1e6,
             result.seconds, download_s, verify_s, load_s)
    return result


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


class NoRestorableCheckpoint(ValueError):
    """Committed checkpoints exist but none restores: starting from scratch would be wrong."""


def restore_latest(app_state: dict, job, *, store: ObjectStore | None = None,
                   root: Path | None = None, verify: bool = True) -> RestoreResult | None:
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
            if problems:
                skipped.append(f"{ref.location}: " + "; ".join(map(str, problems)))
            else:
                listed.append((ref.step, "local" if ref.is_local else "store"))
        skipped += [f"{where} (store unreachable)" for where in unreachable]
    listed, skipped, committed = comm.broadcast_from_rank0((listed, skipped, committed))
    for step, tier in listed:
        if tier == "local":
            ref = CheckpointRef.local(Path(root or local_root(job.name)) / step_dir_name(step))
        else:
            ref = CheckpointRef.remote(store, f"{store_root(job.name)}/{step_dir_name(step)}")
        try:
            result = restore(app_state, ref, job=job, verify=verify, cache_root=root)
        except CheckpointInvalid as e:
            log.warning("cannot restore %s, trying an older one: %s", ref.location, e)
            skipped.append(f"{ref.location}: " + "; ".join(map(str, e.problems)))
            continue
        result.skipped = skipped
        return result
    for line in skipped:
        log.warning("skipped checkpoint %s", line)
    if committed:
        raise NoRestorableCheckpoint(
            f"job {job.name!r} has committed checkpoints but none restores (the model state "
            "may be partly overwritten):\n" + "\n".join(f"  - {line}" for line in skipped))
    return None
