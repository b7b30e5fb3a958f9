"""One training segment on every rank: restore, train to the segment's end step, checkpoint
every `checkpoint.every_steps` and at the end, report; or stop early on preemption.

    result = run_segment(job, site=site, end_step=None)   # inside torchrun workers

The end step defaults to the next multiple of `training.segment_steps` after the restored
step, capped at `training.steps`. Ranks restore the newest valid checkpoint of the job (or
`resume_from`, a checkpoint directory or store location), resharding it if the topology
changed, and start from scratch when there is none. Resuming from an older checkpoint of the
job supersedes its newer ones (catalog/supersede.py) before the first step
(fm_pipeline.checkpoint.load.resume holds that policy).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fm_pipeline.catalog.refs import ref_from_location
from fm_pipeline.checkpoint import CheckpointManager, comm
from fm_pipeline.checkpoint.fast_paths import starts_root
from fm_pipeline.checkpoint.fast_tier import FastRestore
from fm_pipeline.checkpoint.load import resume
from fm_pipeline.config import JobSpec, dump_job
from fm_pipeline.config.site import Site
from fm_pipeline.config.worker_env import WorkerEnv
from fm_pipeline.data import mix_key, open_job_mix
from fm_pipeline.model import count_params, flops_per_token
from fm_pipeline.parallel import ParallelDims, init_distributed
from fm_pipeline.rundir import exit_codes
from fm_pipeline.rundir.attempts import worker_group_start
from fm_pipeline.rundir.events import append_event
from fm_pipeline.train.metrics import host_name, mfu, peak_flops_per_device
from fm_pipeline.train.preemption import PreemptionWatcher, preempt_file
from fm_pipeline.train.reporter import SegmentReporter
from fm_pipeline.train.state import layout_key
from fm_pipeline.train.tracking import TrainerTracking
from fm_pipeline.train.trainer import StepResult, Trainer

log = logging.getLogger(__name__)


class SegmentSetupError(ValueError):
    """A segment that cannot start for a reason retrying will not fix (exit code 2)."""


class SegmentRefused(RuntimeError):
    """A segment that did not start, on every rank, with the exit code that says why."""

    def __init__(self, exit_code: int, message: str):
        self.exit_code = exit_code
        super().__init__(message)


def take_lease(job: JobSpec, store, *, runs: Path):
    """Rank 0 takes the job's lease (rundir/lease.py) before anything is read or written;
    every rank learns the outcome. Returns the lease on rank 0, None elsewhere."""
    from fm_pipeline.rundir.lease import (
        JobLease,
        LeaseHeld,
        LeaseUnavailable,
        StoreIgnoresConditions,
    )

    refused, lease = None, None
    if dist.get_rank() == 0:
        try:
            lease = JobLease(job.name, store=store, ttl_s=job.resilience.lease_ttl_s,
                             run_dir=runs).acquire()
        except LeaseHeld as e:
            refused = (exit_codes.LEASE_HELD, str(e))
        except LeaseUnavailable as e:
            refused = (exit_codes.FAILURE, str(e))
        except StoreIgnoresConditions as e:  # no store fixes itself between retries
            refused = (exit_codes.BAD_CONFIG, str(e))
    refused = comm.broadcast_from_rank0(refused)
    if refused is not None:
        raise SegmentRefused(*refused)
    return lease


@dataclass
class SegmentResult:
    exit_code: int
    exit_reason: str
    start_step: int
    end_step: int
    summary: dict[str, Any] = field(default_factory=dict)


def segment_target(job: JobSpec, start_step: int, end_step: int | None) -> int:
    t = job.training
    if end_step is None:
        return t.segment_end(start_step)
    if end_step > t.steps:
        raise SegmentSetupError(f"--end-step {end_step} exceeds training.steps ({t.steps})")
    if end_step < 1:
        raise SegmentSetupError(f"--end-step must be >= 1, got {end_step}")
    return end_step


def _manifest_topology(manifest) -> str:
    p = manifest.parallelism
    return layout_key(p, world_size=p.world_size, dp_shard=p.dp_shard)


def restore(trainer: Trainer, manager: CheckpointManager, *, resume_from: str | None,
            planned: bool = False, runs: Path | None = None):
    """Load the chosen checkpoint into the trainer (all ranks; checkpoint.load.resume does
    discovery, the load and a rollback's bookkeeping). None: start from scratch.
    `planned`: resume_from is the orchestrator's plan, not a rollback (restore_planned,
    which records a difference in the event log of the job's run directory `runs`)."""
    if planned and resume_from:
        return restore_planned(trainer, manager, planned=resume_from, runs=runs)
    ref = None
    if resume_from:
        try:
            ref = ref_from_location(resume_from, manager.store)
        except ValueError as e:
            raise SegmentSetupError(f"--resume-from {e}") from None

    def rng_of_this_topology(manifest):  # per-rank RNG states exist only for the same mesh
        return trainer.state.restoring_from(_manifest_topology(manifest))

    try:
        return resume(trainer.app_state, trainer.job, store=manager.store, root=manager.root,
                      resume_from=ref, before_load=rng_of_this_topology)
    except (ValueError, FileNotFoundError) as e:  # CheckpointInvalid included
        if ref is None:
            raise
        raise SegmentSetupError(f"cannot read the checkpoint of --resume-from {resume_from}: "
                                f"{type(e).__name__}: {e}") from e


def restore_planned(trainer: Trainer, manager: CheckpointManager, *, planned: str,
                    runs: Path):
    """Restore the newest checkpoint that passes full validation (checksums, torch's
    metadata) and hold it against the orchestrator's plan: normally they are the same. When
    the planned one fails validation an older one restores; when the segment already went
    past its plan (pods recreated by their JobSet carry the same arguments) the newer one
    restores. Either way rank 0 records why in the job's events ("resume_plan_differs")."""
    try:
        planned_step = ref_from_location(planned, manager.store).step
    except ValueError as e:
        raise SegmentSetupError(f"--resume-from {e}") from None
    restored = restore(trainer, manager, resume_from=None)
    step = restored.step if restored is not None else 0
    if step != planned_step:
        if step < planned_step:
            skipped = "; ".join(restored.skipped) if restored is not None else ""
            why = f"the planned checkpoint failed validation{f': {skipped}' if skipped else ''}"
        else:
            why = "a newer checkpoint was committed after the plan (the segment went past it)"
        log.warning("planned to resume %s from step %d, restored step %d: %s",
                    trainer.job.name, planned_step, step, why)
        if dist.get_rank() == 0:
            append_event(runs, "resume_plan_differs", planned=planned,
                         planned_step=planned_step, restored_step=step,
                         restored=restored.source if restored is not None else "scratch",
                         reason=why)
    return restored


def open_fast_tier(job: JobSpec, trainer: Trainer, worker: WorkerEnv):
    """The fast tier of this segment (every rank), or None: off, or not under torchrun (no
    run to restart in place)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if job.checkpoint.memory_every_steps <= 0 or not run_id:
        return None
    from fm_pipeline.checkpoint.fast_tier import FastTier

    return FastTier(job, trainer.app_state, topology=trainer.state.topology, run_id=run_id,
                    worker=worker)


def restore_in_job(fast, manager: CheckpointManager):
    """After an in-job restart: the fast tier's newest step every rank can load, unless the
    durable tier holds a newer one. None: restore from the durable tiers."""
    from fm_pipeline.catalog.refs import newest_committed_step

    durable = comm.broadcast_from_rank0(
        newest_committed_step(manager.root) if dist.get_rank() == 0 else None)
    try:
        return fast.restore(newer_than=durable)
    except RuntimeError as e:  # tensors partly written: the durable restore loads over them
        log.error("%s; restoring from the durable tiers", e)
        return None


def job_attempt() -> tuple[int, list[int]]:
    """(the job's in-job attempt, the nodes that joined it since the last one), collective.
    Each node counts the worker groups its agent started (worker_group_start): a spare that
    replaced a lost node is at its first while the survivors are at n, and every rank must
    take the same restore path."""
    node = int(os.environ.get("GROUP_RANK", 0))
    counts = comm.all_gather((worker_group_start(starts_root()), node))
    attempt = max(c for c, _ in counts)
    return attempt, sorted({node for c, node in counts if c == 0 and attempt > 0})


def in_job_restart_record(restored, *, restore_s: float, fast, attempt: int,
                          joined: list[int], recreated: bool = False,
                          in_process_causes: list[str | None] | None = None) -> dict:
    from fm_pipeline.rundir.attempts import is_peer_loss, previous_attempt, restart_cause

    if in_process_causes:
        ranked = [(r, c) for r, c in enumerate(in_process_causes) if c]
        rank, why = next(((r, c) for r, c in ranked if not is_peer_loss(c)), ranked[0])
        cause = f"rank {rank}: {why.splitlines()[0][:300]} (restarted in the process)"
    elif recreated:
        cause = ("the pods were recreated inside the launch (a JobSet restart); this run's "
                 "snapshots were still in node memory")
    elif joined:
        cause = f"node {', '.join(map(str, joined))} lost: a new node joined in its place"
    else:
        cause = restart_cause(previous_attempt())
    record = {"attempt": attempt, "cause": cause, "joined_nodes": joined,
              "pods_recreated": recreated, "in_process": bool(in_process_causes),
              "tier": _tier_of(restored), "restored_step": restored.step if restored else 0,
              "restore_s": round(restore_s, 3), "steps_redone": None, "from_peer": [],
              "skipped": []}
    if isinstance(restored, FastRestore):
        record.update(steps_redone=restored.steps_redone, from_peer=restored.from_peer,
                      skipped=restored.skipped)
    elif fast is not None:
        record["skipped"] = fast.last_skipped
        reached = fast.reached_step()
        if reached is not None:
            record["steps_redone"] = max(0, reached - (restored.step if restored else 0))
    return record


def _tier_of(restored) -> str | None:
    if restored is None:
        return None
    if isinstance(restored, FastRestore):
        return restored.tier
    return "local" if restored.source == restored.local_path else "store"


class RankTimingWindow:
    """Per-rank sums since the last gather; gathered to rank 0 as per-step means."""

    FIELDS = 6  # compute, collective wait, data wait, step time, work fraction, rows time

    def __init__(self):
        self.sums = [0.0] * self.FIELDS
        self.steps = 0

    def add(self, r: StepResult) -> None:
        for i, v in enumerate((r.compute_s, r.collective_wait_s, r.data_wait_s, r.step_time_s,
                               r.work_fraction, r.rows_s)):
            self.sums[i] += v
        self.steps += 1

    def gather(self, *, step: int, device: torch.device, ranks: list[dict]) -> list[dict]:
        mine = torch.tensor([*self.sums, float(self.steps)], dtype=torch.float64, device=device)
        everyone = [torch.zeros_like(mine) for _ in ranks]
        dist.all_gather(everyone, mine)
        self.sums, self.steps = [0.0] * self.FIELDS, 0
        records = []
        for rank, (info, t) in enumerate(zip(ranks, everyone)):
            compute, wait, data, step_time, work, rows_s, n = t.tolist()
            n = max(n, 1.0)
            records.append(dict(step=step, rank=rank, host=info["host"],
                                local_rank=info["local_rank"], peer_group=info["pp_rank"],
                                compute_s=compute / n, collective_wait_s=wait / n,
                                data_wait_s=data / n, step_time_s=step_time / n,
                                work_fraction=round(work / n, 6), rows_s=rows_s / n,
                                steps=int(n)))
        return records


def plan_params(job: JobSpec, dims: ParallelDims, *, peak: float | None, accelerator: str,
                device: torch.device) -> dict[str, Any]:
    cfg = job.model_cfg
    return {"job": dump_job(job), "plan": {
        "world_size": dims.world_size, "mesh": dict(zip(("dp_replicate", "dp_shard", "pp", "tp"),
                                                        dims.shape)),
        "dp": dims.dp, "device": device.type, "accelerator": accelerator,
        "peak_flops_per_device": peak, "params": count_params(cfg).total,
        "flops_per_token": flops_per_token(cfg, job.training.seq_len),
        "tokens_per_step": job.tokens_per_step, "grad_accum_steps": job.grad_accum_steps,
        "pp_microbatches": job.pp_microbatches if dims.pp > 1 else None}}


@dataclass
class _Setup:
    dims: ParallelDims
    mesh: Any
    trainer: Trainer
    manager: CheckpointManager
    watcher: PreemptionWatcher
    peak: float | None
    accelerator: str
    restored: Any
    restore_s: float
    target: int
    fast: Any = None  # checkpoint.fast_tier.FastTier, when memory_every_steps > 0
    restart: dict | None = None  # this attempt's in-job restart, when it is one
    attempt: int = 0  # the job's in-job restarts before this attempt (job_attempt)


def _setup(job: JobSpec, *, site: Site, worker: WorkerEnv, device: torch.device,
           end_step: int | None, resume_from: str | None, store, lease,
           restart_cause: str | None = None, planned: bool = False) -> _Setup:
    dims = ParallelDims.from_spec(job.parallelism, world_size=dist.get_world_size())
    # DataError if the mix was never prepared (checked first: cheap)
    mix = open_job_mix(job, store, cache_dir=site.data_cache(mix_key(job)))
    mesh = dims.build_mesh(device.type)
    peak, accelerator = peak_flops_per_device(device, job.parallelism.mixed_precision)
    trainer = Trainer(job, dims=dims, mesh=mesh, device=device, rank=dist.get_rank(), mix=mix)
    manager = CheckpointManager(job, trainer.app_state, site=site, mesh=mesh, mix_key=mix.key,
                                store=store, lease=lease)
    fast = open_fast_tier(job, trainer, worker)
    t0 = time.perf_counter()
    restored = None
    attempt, joined = job_attempt()
    # A first attempt that finds this run's snapshots in node memory: the pods were
    # recreated inside the launch (a JobSet restart), the memory outlived them.
    rollback = None if planned else resume_from  # a plan yields to the segment's own progress
    recreated = (fast is not None and rollback is None and attempt == 0
                 and fast.has_snapshots())
    if fast is not None and rollback is None and (attempt > 0 or recreated):
        restored = restore_in_job(fast, manager)
    if restored is None:
        restored = restore(trainer, manager, resume_from=resume_from, planned=planned,
                           runs=site.runs_dir(job.name))
    restore_s = time.perf_counter() - t0
    target = segment_target(job, trainer.state.step, end_step)
    restart = None
    if attempt > 0 or recreated:  # agreed by every rank: the gather below is collective
        # In the process (train.inprocess) every rank knows its own failure; the cause is
        # the first that is not a consequence of another's.
        causes = comm.all_gather(restart_cause)
        restart = in_job_restart_record(
            restored, restore_s=restore_s, fast=fast, attempt=attempt, joined=joined,
            recreated=recreated, in_process_causes=causes if any(causes) else None)
    # Installed last: a SIGTERM during setup still kills the process (nothing to save yet).
    watcher = PreemptionWatcher(preempt_file(site.runs_dir(job.name), worker.preempt_file))
    return _Setup(dims=dims, mesh=mesh, trainer=trainer, manager=manager, watcher=watcher,
                  peak=peak, accelerator=accelerator, restored=restored, restore_s=restore_s,
                  target=target, fast=fast, restart=restart, attempt=attempt)


def run_segment(job: JobSpec, *, site: Site, worker: WorkerEnv = WorkerEnv(),
                tracking: TrainerTracking | None = None,
                end_step: int | None = None, resume_from: str | None = None,
                restart_cause: str | None = None, planned: bool = False) -> SegmentResult:
    """Train this segment on every rank of the (possibly new) default process group, with
    the state of `site` (its store, the job's run directory), where `worker` says this
    process runs (its preemption flag, its node's fast tier).
    `restart_cause`: this rank's failure, when the process runs the segment again in place
    (train.inprocess)."""
    owns_process_group = not dist.is_initialized()
    device = init_distributed(timeout_s=job.resilience.collective_timeout_s)
    store = site.store()
    # One live segment per job, before anything is read.
    lease = take_lease(job, store, runs=site.runs_dir(job.name))
    try:
        return _run_leased(job, site=site, worker=worker, tracking=tracking, device=device,
                           end_step=end_step, resume_from=resume_from, store=store,
                           lease=lease, owns_process_group=owns_process_group,
                           restart_cause=restart_cause, planned=planned)
    finally:
        if lease is not None:
            lease.release()


def _run_leased(job: JobSpec, *, site: Site, worker: WorkerEnv,
                tracking: TrainerTracking | None,
                device: torch.device, end_step: int | None,
                resume_from: str | None, store, lease, owns_process_group: bool,
                restart_cause: str | None = None, planned: bool = False) -> SegmentResult:
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        setup = _setup(job, site=site, worker=worker, device=device, end_step=end_step,
                       resume_from=resume_from, store=store, lease=lease,
                       restart_cause=restart_cause, planned=planned)
    except ValueError as e:  # bad input of any kind, found before the first step
        raise SegmentSetupError(f"{type(e).__name__}: {e}") from e
    dims, mesh, trainer, manager, watcher = (setup.dims, setup.mesh, setup.trainer,
                                             setup.manager, setup.watcher)
    if lease is not None:  # taken over meanwhile: stop after this step, commit nothing
        lease.start_heartbeat(on_lost=watcher.request)
    peak, accelerator, restored = setup.peak, setup.accelerator, setup.restored
    start, target, runs = trainer.state.step, setup.target, site.runs_dir(job.name)
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, {"host": host_name(), "local_rank": int(
        os.environ.get("LOCAL_RANK", 0)), "pp_rank": mesh["pp"].get_local_rank()})
    reporter = None
    if rank == 0:
        reporter = SegmentReporter(job_name=job.name, runs_dir=runs, start_step=start,
                                   target_step=target, tracking=tracking,
                                   params=plan_params(job, dims, peak=peak,
                                                      accelerator=accelerator, device=device))
    summary: dict[str, Any] = {
        "start_step": start, "target_step": target, "world_size": world,
        "attempt": setup.attempt,  # torchrun's in-job restarts before this one
        "worker_pid": os.getpid(),  # rank 0's: the same after a restart in the process
        "parallelism": dict(zip(("dp_replicate", "dp_shard", "pp", "tp"), dims.shape),
                            **({"ep": dims.ep} if dims.ep > 1 else {})),
        "restored_from": restored.source if restored else None,
        "resharded": bool(restored) and not isinstance(restored, FastRestore) and (
            _manifest_topology(restored.manifest) != trainer.state.topology),
        "restored_tier": _tier_of(restored),
        "inplace_restart": setup.restart,
        # Scalars of it for Dagster metadata and MLflow (Pipes carries scalars only).
        "inplace_restarts": setup.attempt or int(setup.restart is not None),
        **({f"inplace_{k}": setup.restart[k] for k in ("cause", "restore_s", "steps_redone")
            if setup.restart[k] is not None} if setup.restart else {}),
        "rng_restored": trainer.state.rng_restored,
        "restore_s": round(setup.restore_s, 3) if restored else None,
        "accelerator": accelerator, "peak_flops_per_device": peak,
        "lease": None if lease is None else {"holder": lease.holder,
                                             "taken_over": lease.taken_over},
    }
    stragglers = None
    if reporter is not None:
        from fm_pipeline.stragglers.watch import StragglerWatch

        stragglers = StragglerWatch.for_segment(
            job, runs=runs, segment=reporter.segment, world_size=world, mlflow=reporter.mlflow,
            gather_every=job.training.rank_timings_every)
    error: BaseException | None = None
    t_loop = time.perf_counter()
    try:
        if setup.restart is not None and rank == 0:
            append_event(runs, "inplace_restart", segment=reporter.segment,
                         **setup.restart)
        loop_summary = _train(trainer, manager, watcher, reporter, target=target, device=device,
                              ranks=ranks, peak=peak, stragglers=stragglers, fast=setup.fast)
        summary.update(loop_summary)
    except BaseException as e:
        error = e
        summary.update(exit_code=exit_codes.FAILURE, exit_reason="failed",
                       error=f"{type(e).__name__}: {e}", end_step=trainer.state.step)
        raise
    finally:
        summary.update(wall_s=round(time.perf_counter() - t_loop, 3),
                       tokens_seen=trainer.state.tokens_seen)
        if stragglers is not None:
            stragglers.close(end_step=trainer.state.step)
        if reporter is not None:
            reporter.close(summary, error=error)
        watcher.close()
        trainer.close()
    if summary["exit_reason"] == "preempted":
        watcher.consume_flag_file()
    dist.barrier()
    if owns_process_group:
        dist.destroy_process_group()
    return SegmentResult(exit_code=summary["exit_code"], exit_reason=summary["exit_reason"],
                         start_step=start, end_step=summary["end_step"], summary=summary)


def _train(trainer: Trainer, manager: CheckpointManager, watcher: PreemptionWatcher,
           reporter: SegmentReporter | None, *, target: int, device: torch.device,
           ranks: list[dict], peak: float | None, stragglers=None,
           fast=None) -> dict[str, Any]:
    job, t = trainer.job, trainer.job.training
    fpt = flops_per_token(job.model_cfg, t.seq_len)
    window = RankTimingWindow()
    last: StepResult | None = None
    speeds, mfus, memory, unlogged = [], [], [], 0
    stopped = False
    try:
        while trainer.state.step < target and not stopped:
            result = trainer.step(stop_requested=watcher.requested())
            last, step, stopped = result, result.step, result.stop_requested
            window.add(result)
            block = 0.0
            if stopped or manager.should_save(step) or step == target:
                t0 = time.perf_counter()
                manager.save(step, tokens_seen=trainer.state.tokens_seen, probe=trainer.probe(),
                             final=stopped or step == target)
                block = time.perf_counter() - t0
            if fast is not None:
                fast.record_progress(step)
                if fast.due(step) and not stopped and step < target:
                    t0 = time.perf_counter()
                    fast.snapshot(step, tokens_seen=trainer.state.tokens_seen)
                    block += time.perf_counter() - t0
            step_mfu = mfu(flops_per_token=fpt, tokens=job.tokens_per_step,
                           step_time_s=result.step_time_s, devices=len(ranks), peak_flops=peak)
            tokens_per_s = job.tokens_per_step / result.step_time_s
            speeds.append(tokens_per_s)
            mfus.append(step_mfu)
            if result.peak_memory_gib is not None:
                memory.append(result.peak_memory_gib)
            unlogged += 1
            if step % t.rank_timings_every == 0:
                records = window.gather(step=step, device=device, ranks=ranks)
                if reporter is not None:
                    reporter.rank_timings(records)
                if stragglers is not None and (reason := stragglers.update(records)):
                    watcher.request(reason)  # all ranks stop after the next step's sync
                if stragglers is not None and trainer.plan_slots:
                    trainer.next_row_plan = stragglers.row_plan()  # sent with the next sync
            if reporter is not None and (step % t.log_every == 0 or stopped or step == target):
                reporter.advance(unlogged - 1)
                unlogged = 0
                reporter.step(dict(
                    step=step, loss=result.loss, grad_norm=result.grad_norm, lr=result.lr,
                    step_time_s=round(result.step_time_s, 6), tokens=job.tokens_per_step,
                    tokens_seen=trainer.state.tokens_seen, tokens_per_s=round(tokens_per_s, 3),
                    tokens_dropped=result.tokens_dropped,
                    mfu=step_mfu, data_wait_s=round(result.data_wait_s, 6),
                    checkpoint_block_s=round(block, 6), peak_memory_gib=result.peak_memory_gib,
                    process_cpu_s=round(result.process_cpu_s, 6), **(result.router or {})))
    except BaseException:
        try:  # let an in-flight save finish (or fail) before the process goes
            manager.close()
        except Exception as e:
            log.error("checkpoint save in flight at the failure did not commit: %s", e)
        if fast is not None:  # kept: an in-job restart restores from it
            try:
                fast.close()
            except Exception as e:  # a peer gone mid-exchange: the failure above is the news
                log.error("fast snapshot in flight at the failure did not finish: %s", e)
        raise
    manager.close()  # waits for the last save: its manifest must exist before we exit
    fast_report = None
    if fast is not None:  # a clean end: the next segment restores from the durable tier
        fast.close(discard=True)
        fast_report = fast.report()
    # The first step pays for warm-up (allocations, pipeline shape inference): left out.
    warm_speeds = speeds[1:] or speeds
    warm_mfus = [m for m in (mfus[1:] or mfus) if m is not None]
    committed = [r for r in manager.results if r.committed]
    since = watcher.seconds_since_request()
    if stopped and since is not None and since > t.preemption_grace_s:
        log.warning("preemption took %.1fs from the request to the committed checkpoint, more "
                    "than training.preemption_grace_s (%.0fs): raise the pod's grace period or "
                    "checkpoint more often", since, t.preemption_grace_s)
    return {
        "end_step": trainer.state.step,
        "exit_code": exit_codes.PREEMPTED if stopped else exit_codes.SUCCESS,
        "exit_reason": "preempted" if stopped else (
            "completed" if last is not None else "nothing_to_do"),
        "error": None,
        "final_loss": last.loss if last else None,
        "mean_mfu": sum(warm_mfus) / len(warm_mfus) if warm_mfus else None,
        "tokens_per_s": sum(warm_speeds) / len(warm_speeds) if warm_speeds else None,
        "checkpoint": committed[-1].path if committed else None,
        "checkpoint_block_s": round(sum(r.blocked_s for r in manager.results), 6),
        "peak_memory_gib": max(memory) if memory else None,
        "preempt_reason": watcher.reason if stopped else None,
        "preempt_to_exit_s": round(since, 3) if stopped and since is not None else None,
        "fast_tier": fast_report,
    }
