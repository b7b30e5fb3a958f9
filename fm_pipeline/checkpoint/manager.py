"""CheckpointManager: the trainer's one object for saving and resuming, inside torchrun ranks.

    manager = CheckpointManager(job, app_state, site=site, mesh=mesh, mix_key=key)
    restored = manager.restore_latest()              # None on a fresh start
    for step in range(start, end + 1):
        ...train...
        if manager.should_save(step) or step == end:
            manager.save(step, tokens_seen=..., probe=Probe(batch, loss), final=step == end)
    result = manager.close()                         # waits for the last save and its upload

An async save blocks the loop only while the state is copied to host memory (staging, see
staging.py: by default the copy overlaps the next forward/backward and the optimizer step
waits for it); writing (checksummed and flushed to disk as it streams, writer.py), the
manifest, upload and retention then run in one background thread that talks to the other
ranks over its own gloo group (the default group keeps serving training; sharing it would
interleave collectives). The commit is collective (commit.py): nodes need not share a
filesystem, each node's directory holds its ranks' files (shared_dirs.py) and the store tier
holds the whole checkpoint. At most one save is in
flight: a second one waits (`on_busy="wait"`, default) or is skipped with a logged reason
(`"skip"`); final saves always wait. All ranks call `save`, `restore_latest` and `close` at
the same step.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.utils.serialization.config as serialization_config

from fm_pipeline.catalog.set_aside import in_the_way, set_aside
from fm_pipeline.catalog.set_aside import stamp as aside_stamp
from fm_pipeline.catalog.manifest import DataInfo, ModelInfo, fsync_dir
from fm_pipeline.catalog.refs import (
    MANIFEST,
    CheckpointRef,
    parse_step,
    step_dir_name,
)
from fm_pipeline.catalog.retention import RetentionReport
from fm_pipeline.catalog.tiering import UploadReport
from fm_pipeline.catalog.validity import record_verified
from fm_pipeline.checkpoint import comm
from fm_pipeline.checkpoint.commit import (
    Probe,
    SaveContext,
    build_manifest,
    commit_local,
    parallelism_info,
    write_probe,
)
from fm_pipeline.checkpoint.shared_dirs import discover_copies
from fm_pipeline.checkpoint.publish import Publisher
from fm_pipeline.checkpoint.writer import ChecksummingWriter
from fm_pipeline.storage import ObjectStore

log = logging.getLogger(__name__)

WRITE_THREADS = 1  # DCP files per rank, written in parallel (see benchmarks/checkpoint.py)


class CheckpointSaveError(RuntimeError):
    """A save that did not commit; training should stop rather than run unprotected."""


@dataclass
class SaveResult:
    """The outcome of one save, identical on every rank."""

    step: int
    path: str
    committed: bool
    error: str | None = None
    lease_lost: bool = False  # the job's lease was taken over: stop, do not retry here
    blocked_s: float = 0.0  # in save(), plus staging_wait_s once harvested
    waited_s: float = 0.0
    staging_wait_s: float = 0.0  # optimizer steps waiting for an overlapped host copy
    stage_s: float = 0.0
    write_s: float = 0.0
    checksum_s: float = 0.0
    commit_s: float = 0.0
    total_bytes: int = 0
    upload: UploadReport | None = None
    retention: list[RetentionReport] = field(default_factory=list)
    events: dict[str, float] = field(default_factory=dict)  # perf_counter() stamps, this rank


class CheckpointManager:
    def __init__(self, job, app_state: dict, *, site, mesh=None, mix_key: str | None = None,
                 root: str | Path | None = None, store: ObjectStore | None = None,
                 upload: bool | None = None, async_save: bool | None = None,
                 on_busy: str = "wait", staging: str = "overlap", checksum: str = "crc32c",
                 write_threads: int = WRITE_THREADS, lease=None):
        from fm_pipeline.catalog.manifest import CHECKSUMS

        if checksum not in CHECKSUMS:
            raise ValueError(f"checksum must be one of {sorted(CHECKSUMS)}, got {checksum!r}")
        self.checksum = checksum
        if write_threads < 1:
            raise ValueError(f"write_threads must be >= 1, got {write_threads}")
        self.write_threads = write_threads
        if on_busy not in ("wait", "skip"):
            raise ValueError(f"on_busy must be 'wait' or 'skip', got {on_busy!r}")
        missing = {"model"} - app_state.keys()
        if missing:
            raise ValueError(f"app_state needs a 'model' part; it has {sorted(app_state)}")
        self.job = job
        self.app_state = app_state
        self.mesh = mesh
        self.mix_key = mix_key
        self.root = Path(root) if root is not None else site.checkpoints_dir(job.name)
        self.async_save = job.checkpoint.async_save if async_save is None else async_save
        self.on_busy = on_busy
        self.upload = job.checkpoint.upload if upload is None else upload
        self.store = store if store is not None else site.store()  # restore looks here too
        self.rank, self.world_size = comm.rank(), comm.world_size()
        self.lease = lease  # rundir.lease.JobLease on rank 0: no commit once it is lost
        # Saves talk over their own group: the default one is busy with training collectives.
        self._group = dist.new_group(backend="gloo") if comm.initialized() else None
        self.copies = discover_copies(self.root)  # do the nodes share the local tier?
        if not self.copies.shared and not self.upload:
            log.warning("the local checkpoint tier is not shared by all %d ranks (%d separate "
                        "directories) and uploads are off: no single place will hold a whole "
                        "checkpoint, so none can be restored", self.world_size,
                        self.copies.count)
        self._publisher = Publisher(job, store=self.store, root=self.root, copies=self.copies,
                                    group=self._group, rank=self.rank, lease=lease)
        self._stager = None
        if self.async_save:
            from fm_pipeline.checkpoint.staging import HostStager
            from fm_pipeline.checkpoint.state import OptimizerState

            optim = app_state.get("optimizer")
            optimizers = optim.optimizers if isinstance(optim, OptimizerState) else []
            self._stager = HostStager(mode=staging, optimizers=optimizers)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fm-ckpt",
                                            initializer=comm.single_threaded)
        self._inflight: Future | None = None
        self.results: list[SaveResult] = []
        self.skipped: list[tuple[int, str]] = []

    # -- saving -----------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        return step > 0 and step % self.job.checkpoint.every_steps == 0

    def save(self, step: int, *, tokens_seen: int, probe: Probe | None = None,
             final: bool = False) -> Future | None:
        """Checkpoint the current state as `step`. Returns a future of the SaveResult (already
        done for sync saves), or None when skipped (reason logged and in `self.skipped`)."""
        t0 = time.perf_counter()
        busy = comm.any_rank(self._inflight is not None and not self._inflight.done())
        if busy and not final and self.on_busy == "skip":
            return self._skip(step, "the previous save is still being written (on_busy=skip)")
        self._harvest()
        events = {"save_called": t0, "previous_done": time.perf_counter()}
        directory = self.root / step_dir_name(step)
        if (why := self._clear_the_way(directory)) is not None:
            return self._skip(step, why)
        probe_entry = None
        if self.copies.leader:  # rank 0, and on nodes with their own disk their first rank
            if directory.exists():  # leftover of a crashed save of this step
                shutil.rmtree(directory)
            directory.mkdir(parents=True)
        if self.rank == 0 and probe is not None:
            probe_entry = write_probe(directory, probe, algorithm=self.checksum)
        comm.barrier()
        state = {k: v.state_dict() if hasattr(v, "state_dict") else v
                 for k, v in self.app_state.items()}
        ctx = replace(self._context(step, tokens_seen, probe, t0,
                                    waited_s=events["previous_done"] - t0),
                      probe_entry=probe_entry)
        if self.async_save:
            staged = self._stager.stage(state)
            del state
            events["returned"] = time.perf_counter()
            ctx = replace(ctx, blocked_s=events["returned"] - t0)
            self._inflight = self._executor.submit(self._persist, staged, directory, ctx, events)
            return self._inflight
        result = self._persist(state, directory, ctx, events)
        result.blocked_s = time.perf_counter() - t0
        done: Future = Future()
        done.set_result(result)
        self._finish(result)
        return done

    def _clear_the_way(self, directory: Path) -> str | None:
        """A committed checkpoint already at this step (a resume that fell back past it, a
        rollback): rank 0 judges it on its checksums; a superseded or invalid one is set aside
        in every copy (kept, with the reason), a valid one makes this save skip (the reason
        is returned)."""
        decision = None
        if self.rank == 0 and (directory / MANIFEST).is_file():
            kind, why = in_the_way(CheckpointRef.local(directory), self.job,
                                   partial_copy=not self.copies.shared)
            decision = (kind, why, aside_stamp())
        kind, why, when = comm.broadcast_from_rank0(decision) or (None, None, None)
        if kind == "keep":
            return why
        if kind is not None and self.copies.leader and directory.is_dir():
            set_aside(CheckpointRef.local(directory), kind=kind, when=when,
                      reason=f"{why} (a new save of step {parse_step(directory.name)} took "
                             "its place)")
        return None

    def _skip(self, step: int, reason: str) -> None:
        log.warning("checkpoint at step %d skipped: %s", step, reason)
        self.skipped.append((step, reason))
        return None

    @functools.cached_property
    def _static(self) -> dict:
        """The parts of every manifest that do not change within a run (computed once: the
        loop is blocked while save() runs)."""
        from fm_pipeline.config import dump_job

        cfg = self.job.model_cfg
        return dict(
            job_spec=dump_job(self.job), job_name=self.job.name,
            state_keys=sorted(self.app_state),
            parallelism=parallelism_info(self.job, world_size=self.world_size, mesh=self.mesh),
            model=ModelInfo(config=cfg.model_dump(), hash=cfg.config_hash()))

    def _context(self, step: int, tokens_seen: int, probe: Probe | None, t0: float, *,
                 waited_s: float) -> SaveContext:
        cursor = None
        loader = self.app_state.get("dataloader")
        if loader is not None and hasattr(loader, "state_dict"):
            cursor = dict(loader.state_dict())
        return SaveContext(
            **self._static, step=step, tokens_seen=tokens_seen,
            data=DataInfo(mix=self.mix_key, cursor=_plain(cursor),
                          global_batch_size=self.job.training.global_batch_size,
                          seq_len=self.job.training.seq_len),
            probe_loss=None if probe is None else float(probe.loss),
            probe_shape=None if probe is None else list(probe.tokens.shape),
            started_at=t0, waited_s=waited_s, blocked_s=None, async_save=self.async_save,
        )

    def _persist(self, state: dict | Future, directory: Path, ctx: SaveContext,
                 events: dict) -> SaveResult:
        """Write (checksummed, durable), commit, upload, retain. Runs on every rank (background
        thread when async); every rank reaches every collective even when its own work
        failed."""
        entries, error, stage_s, write_s, checksum_s = [], None, 0.0, 0.0, 0.0
        writer = ChecksummingWriter(directory, algorithm=self.checksum,
                                    thread_count=self.write_threads)
        try:
            if isinstance(state, Future):
                state = state.result()
            t = events["write_started"] = time.perf_counter()
            stage_s = t - events.get("returned", t)
            # Each file is hashed as it streams and fsynced as it closes. The per-record zip
            # CRC32 of torch.save is skipped: the manifest checksums whole files.
            with comm.quiet_single_process(), serialization_config.patch(
                    {"save.compute_crc32": False}):
                dcp.save(state, process_group=self._group, no_dist=not comm.initialized(),
                         storage_writer=writer)
            events["write_finished"] = time.perf_counter()
            write_s = events["write_finished"] - t
            entries = writer.entries() + ([ctx.probe_entry] if ctx.probe_entry else [])
            fsync_dir(directory)  # the files' names
            events["durable"] = time.perf_counter()
            checksum_s = events["durable"] - events["write_finished"]
        # Any failure must still reach the gather below; DCP's CheckpointException is a
        # BaseException. The free space is named: torch's zip writer hides ENOSPC.
        except (Exception, dcp.api.CheckpointException) as e:
            error = (f"rank {self.rank} ({_free_mb(directory):.1f} MB free where the "
                     f"checkpoint is written): {type(e).__name__}: {e}")
            log.exception("checkpoint step %d: write failed on rank %d", ctx.step, self.rank)
        state = None  # release the staged copy's references before the slow tail
        gathered = comm.gather_to_rank0((entries, write_s, checksum_s, error, stage_s),
                                        self._group)
        result = None
        if self.rank == 0:
            ctx = replace(ctx, stage_s=max(g[4] for g in gathered))
            result = self._commit(directory, ctx, gathered, writer.referenced)
        result = comm.broadcast_from_rank0(result, self._group)
        result.events = {**events, "committed": time.perf_counter()}
        if result.committed and not self.copies.shared:
            self._publisher.copy_manifest(directory)
        if result.committed and self.upload:
            result.upload = self._publisher.upload(directory, ctx.step,
                                                   [e.path for e in entries])
        if result.committed:
            result.retention = self._publisher.retain(ctx.step, result.upload)
        result.events["done"] = time.perf_counter()
        return result

    def _commit(self, directory: Path, ctx: SaveContext, gathered: list,
                referenced: set[str] | None) -> SaveResult:
        errors = [g[3] for g in gathered if g[3]]
        if self.lease is not None and self.lease.lost:  # another segment now owns the job
            errors.append(f"rank 0: {self.lease.lost}")
        write_s = max(g[1] for g in gathered)
        checksum_s = max(g[2] for g in gathered)
        result = SaveResult(step=ctx.step, path=str(directory), committed=False,
                            blocked_s=ctx.blocked_s or 0.0, waited_s=ctx.waited_s,
                            stage_s=ctx.stage_s, write_s=write_s, checksum_s=checksum_s)
        if not errors:
            try:
                entries = [e for g in gathered for e in g[0]]
                manifest = build_manifest(ctx, entries, write_s=write_s, checksum_s=checksum_s,
                                          commit_s=time.perf_counter() - ctx.started_at)
                commit_local(directory, manifest, referenced=referenced,
                             all_files_here=self.copies.shared)
                if self.copies.shared:  # so retention need not re-read it (validity.py)
                    record_verified(CheckpointRef.local(directory), how="written")
                result.committed, result.total_bytes = True, manifest.total_bytes
                result.commit_s = manifest.timings.commit_s
            except Exception as e:
                errors.append(f"rank 0: manifest: {type(e).__name__}: {e}")
        if errors:
            result.error = "; ".join(errors)
            result.lease_lost = self.lease is not None and bool(self.lease.lost)
            log.error("checkpoint step %d NOT committed: %s", ctx.step, result.error)
        else:
            log.info("checkpoint step %d committed: %s (%.1f MB, blocked %.3fs, write %.2fs, "
                     "hash %.2fs)", ctx.step, directory, result.total_bytes / 1e6,
                     result.blocked_s, write_s, checksum_s)
        return result

    def _finish(self, result: SaveResult) -> SaveResult:
        if self._stager is not None:
            result.staging_wait_s = self._stager.take_wait_s()
            result.blocked_s += result.staging_wait_s
        self.results.append(result)
        if result.lease_lost:
            from fm_pipeline.rundir.lease import LeaseLost

            raise LeaseLost(f"checkpoint at step {result.step} not committed: {result.error}")
        if not result.committed:
            raise CheckpointSaveError(f"checkpoint at step {result.step} did not commit: "
                                      f"{result.error}")
        return result

    def _harvest(self) -> SaveResult | None:
        if self._inflight is None:
            return None
        fut, self._inflight = self._inflight, None
        return self._finish(fut.result())

    def wait(self) -> SaveResult | None:
        """Block until the in-flight save (if any) is committed; raise if it failed."""
        return self._harvest()

    def close(self) -> SaveResult | None:
        """Wait for the last save, then release the thread and the staging buffers."""
        try:
            return self._harvest()
        finally:
            self._executor.shutdown(wait=True)
            if self._stager is not None:
                self._stager.close()

    # -- resuming ---------------------------------------------------------------------------

    def restore_latest(self, *, verify: bool = True):
        """Load the newest valid checkpoint of this job (local or store tier) into app_state,
        resharding to the current topology. Returns a RestoreResult, or None if there is none."""
        from fm_pipeline.checkpoint.load import restore_latest

        return restore_latest(self.app_state, self.job, store=self.store, root=self.root,
                              verify=verify)


def _free_mb(directory: Path) -> float:
    try:
        return shutil.disk_usage(directory).free / 1e6
    except OSError:
        return float("nan")


def _plain(obj):
    """Data-loader state as JSON-able values (tensors become lists) for the manifest."""
    if obj is None:
        return None
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
