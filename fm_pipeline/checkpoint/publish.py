"""After a checkpoint commits locally: every node's copy of the manifest, the store tier,
retention. Runs in the save's background thread on every rank, over the checkpoint's own
gloo group; rank 0 decides, the other ranks follow.

    publisher = Publisher(job, store=store, root=root, copies=copies, group=group)
    publisher.copy_manifest(directory)       # nodes with their own disk (shared_dirs.py)
    report = publisher.upload(directory, step, own_files)   # each rank its own files
    reports = publisher.retain(step, report)                 # rank 0's reports

Upload: each rank uploads the files it wrote (no rank reads another node's disk), then rank 0
checks every file of the manifest is in the store with its size and uploads the manifest
last: only then is the checkpoint committed remotely. Retention: rank 0 retries older
pending uploads (when one directory holds whole checkpoints) and applies the job's policy to
both tiers; nodes with their own disk then delete the steps rank 0 deleted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.catalog.set_aside import set_aside
from fm_pipeline.catalog.manifest import atomic_write
from fm_pipeline.catalog.refs import MANIFEST, CheckpointRef, delete_checkpoint, list_local
from fm_pipeline.catalog.retention import apply_retention
from fm_pipeline.catalog.tiering import (
    UploadReport,
    clear_remote_step,
    commit_remote,
    pending_uploads,
    record_upload,
    remote_prefix,
    sync_to_store,
    upload_files,
)
from fm_pipeline.checkpoint import comm
from fm_pipeline.checkpoint.shared_dirs import Copies
from fm_pipeline.rundir.lease import LeaseLost
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)


@dataclass
class Publisher:
    job: object  # JobSpec
    store: ObjectStore
    root: Path
    copies: Copies
    group: object = None  # the checkpoint's gloo process group
    rank: int = 0
    lease: object = None  # rundir.lease.JobLease on rank 0: confirmed before a remote commit

    def copy_manifest(self, directory: Path) -> None:
        """Nodes with their own disk keep the manifest next to their share of the files."""
        data = comm.broadcast_from_rank0(
            (directory / MANIFEST).read_bytes() if self.rank == 0 else None, self.group)
        if self.copies.leader and self.rank != 0:
            atomic_write(directory / MANIFEST, data)

    def upload(self, directory: Path, step: int, own: list[str]) -> UploadReport:
        """Each rank uploads the files it wrote; rank 0 commits the manifest last."""
        prefix = remote_prefix(self.job.name, CheckpointRef.local(directory))
        t0 = time.perf_counter()
        cleared = None
        if self.rank == 0:  # a superseded checkpoint of this step may be in the way
            try:
                clear_remote_step(self.store, prefix, (directory / MANIFEST).read_bytes())
            except StoreError as e:
                cleared = f"clearing {self.store.uri_of(prefix)}: {e}"
        cleared = comm.broadcast_from_rank0(cleared, self.group)  # nobody uploads before
        if cleared:
            errors = [cleared] if self.rank == 0 else []
        else:
            errors = upload_files(directory, self.store, prefix, own)
        gathered = comm.gather_to_rank0(errors, self.group)
        report = None
        if self.rank == 0:
            from fm_pipeline.catalog.validate import read_manifest

            local = CheckpointRef.local(directory)
            all_errors = [e for errs in gathered for e in errs]
            manifest = read_manifest(local)
            if not all_errors:
                try:
                    if self.lease is not None:  # still ours? (the store decides)
                        self.lease.confirm()
                    commit_remote(self.store, prefix, manifest, local.read_bytes(MANIFEST))
                except (StoreError, LeaseLost) as e:
                    all_errors.append(str(e))
            report = UploadReport(step=step, store_uri=self.store.uri, prefix=prefix,
                                  committed=not all_errors, files=len(manifest.files),
                                  bytes=manifest.total_bytes, seconds=time.perf_counter() - t0,
                                  error="; ".join(all_errors) if all_errors else None)
            record_upload(local, report, self.store)
        return comm.broadcast_from_rank0(report, self.group)

    def retain(self, step: int, upload: UploadReport | None) -> list:
        """Rank 0 retries older pending uploads and applies retention; on nodes with their own
        disk, the other copies then drop what rank 0 dropped."""
        reports = self._retain_on_rank0(step, upload) if self.rank == 0 else []
        if not self.copies.shared:
            kept = None
            if self.rank == 0 and reports and reports[0].tier == "local":
                kept = (step, set(reports[0].kept), dict(reports[0].set_aside))
            kept = comm.broadcast_from_rank0(kept, self.group)
            if kept is not None and self.copies.leader and self.rank != 0:
                self._prune_copy(*kept)
        return reports

    def _warn_pending_uploads(self, step: int) -> None:
        try:
            pending = [r.step for r in pending_uploads(self.job.name, self.store, root=self.root)
                       if r.step != step]
        except StoreError:
            return
        if pending:
            log.warning("checkpoints %s never reached %s and are not retried: their files are "
                        "spread over the nodes' disks", pending, self.store.uri)

    def _prune_copy(self, newest: int, kept: set[int], invalid: dict[int, str]) -> None:
        for ref in list_local(self.root):
            if ref.step in invalid:  # rank 0 set its copy aside: this one goes beside it
                set_aside(ref, kind="invalid", reason=f"retention on rank 0: {invalid[ref.step]}")
            elif ref.step < newest and ref.step not in kept:
                freed = delete_checkpoint(ref)
                log.info("retention deleted this node's copy %s (%.1f MB)", ref.location,
                         freed / 1e6)

    def _retain_on_rank0(self, step: int, upload: UploadReport | None) -> list:
        ck = self.job.checkpoint
        reports = []
        if upload is not None and upload.committed:
            if self.copies.shared:
                sync_to_store(self.job.name, self.store, root=self.root, exclude_steps={step})
            else:
                self._warn_pending_uploads(step)
        try:
            reports.append(apply_retention(self.job.name, keep_last=ck.keep_last,
                                           milestone_every=ck.milestone_every, job=self.job,
                                           root=self.root, known_valid={step},
                                           partial_copy=not self.copies.shared))
            if upload is not None and upload.committed:
                reports.append(apply_retention(self.job.name, keep_last=ck.keep_last,
                                               milestone_every=ck.milestone_every,
                                               tier="store", store=self.store, job=self.job))
        except (OSError, StoreError) as e:
            log.error("retention after step %d failed: %s", step, e)
        return reports

