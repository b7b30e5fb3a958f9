"""Train one segment of a job: the torchrun entry point.

    torchrun --standalone --nproc-per-node 2 -m fm_pipeline.train --job configs/demo.yaml
    torchrun ... -m fm_pipeline.train --job JOB.yaml --end-step 40 --set training.lr=1e-3
    python -m fm_pipeline.train --job JOB.yaml     # a world of one, without torchrun

Resumes from the job's newest valid checkpoint (or --resume-from DIR_OR_STORE_LOCATION, a
rollback; with --planned it is the orchestrator's plan, held against the newest valid one),
trains to --end-step (default: the next multiple of training.segment_steps, capped at
training.steps), checkpoints every checkpoint.every_steps and at the end. The data mix must
be prepared first (`fm data prepare --job JOB.yaml`).

Exit codes (fm_pipeline.rundir.exit_codes): 0 done, 1 failure (retryable), 2 bad config or
a permanent failure (nothing will fix it by retrying: a corrupt shard, a read-only
checkpoint directory; one line says which), 3 lease held (another live segment of the job
holds its lease: this one did nothing), 75 preempted (SIGTERM or the flag file; a checkpoint
was saved).
torchrun itself exits 1 whenever a worker exits non-zero: the worker's code and reason are
in its error file (see fm_pipeline.launch.outcome) and in runs_dir/segments.jsonl.

A world size different from the job's (an elastic restart on fewer nodes) is accepted when
the job lets dp_shard be inferred (unset or -1): the degrees are re-derived and the same
global batch continues on the new mesh. Otherwise it is a bad config naming the degrees.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fm_pipeline.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True, type=Path, help="job spec YAML")
    parser.add_argument("--end-step", type=int, default=None,
                        help="stop after this step (default: the end of the segment)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="DOTTED.KEY=VALUE", help="override a job spec field (repeatable)")
    parser.add_argument("--resume-from", default=None,
                        help="a checkpoint directory or store location instead of the newest")
    parser.add_argument("--planned", action="store_true",
                        help="--resume-from is the orchestrator's plan, not a rollback: the "
                             "newest valid checkpoint restores, and the job's events say why "
                             "when it is not the planned one")
    return parser.parse_args(argv)


def parse_overrides(pairs: list[str]) -> dict:
    from fm_pipeline.config import parse_overrides as parse

    return parse(pairs, where="--set")


def load_job_for_world(path: Path, overrides: dict, *, world_size: int, local_world_size: int):
    """The job, with nnodes/nproc_per_node re-derived for an elastic world when allowed (the
    spec declares dp_shard -1: it keeps what it declared, config/spec.py)."""
    from fm_pipeline.config import JobSpecError, load_job

    job = load_job(path, **overrides)
    p = job.parallelism
    if p.world_size == world_size:
        return job
    if p.dp_shard == -1 and world_size % local_world_size == 0:
        return load_job(path, **{**overrides, "parallelism.nnodes": world_size // local_world_size,
                                 "parallelism.nproc_per_node": local_world_size})
    raise JobSpecError(str(path), [("parallelism", (
        f"dp_replicate {p.dp_replicate} x dp_shard {p.resolved_dp_shard} x pp {p.pp} x tp "
        f"{p.tp} = {p.world_size} ranks, but torchrun started {world_size}; set "
        "nnodes/nproc_per_node to match, or leave dp_shard unset (-1) to let it follow the "
        "world size"))])


def permanent_reason(error: BaseException) -> str | None:
    """One line when retrying cannot fix `error` (exit 2, not the retryable 1): data that does
    not match its manifest, a tier that refuses writes. None for anything else."""
    import errno

    from fm_pipeline.data.errors import DataError

    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DataError):
            return f"{type(e).__name__}: {e}"
        if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            where = f" ({e.filename})" if e.filename else ""
            return f"{e.strerror or e}{where}: fix the permissions or mount, then resume"
        e = e.__cause__ or e.__context__
    return None


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"[rank{rank}] %(asctime)s %(name)s %(levelname)s: %(message)s")


def main(argv: list[str] | None = None) -> None:
    from fm_pipeline.config import JobSpecError
    from fm_pipeline.config.worker_env import WorkerEnv
    from fm_pipeline.rundir import exit_codes
    from fm_pipeline.rundir.exit_record import exit_with as exit_

    args = parse_args(argv)
    # What the launcher says about where this worker runs, read once and passed down.
    worker = WorkerEnv.from_environ()

    def exit_with(code: int, reason: str) -> NoReturn:
        exit_(code, reason, termination_log=worker.termination_log)

    _setup_logging()
    try:  # before torch is imported: a bad config fails in well under a second
        job = load_job_for_world(
            args.job, parse_overrides(args.overrides),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except JobSpecError as e:
        print(f"error: {e}", file=sys.stderr)
        exit_with(exit_codes.BAD_CONFIG, str(e))

    from fm_pipeline.rundir.attempts import deliberate_stop, previous_attempt

    if (stop := deliberate_stop(previous_attempt())) is not None:
        # torchrun restarts workers on any non-zero exit; a stop on purpose stays a stop.
        said = " (the previous attempt stopped on purpose: not restarted)"
        exit_with(stop.exit_code, stop.reason if said in stop.reason else stop.reason + said)

    from torch.distributed.elastic.multiprocessing.errors import record

    from fm_pipeline.train.host_memory import keep_freed_host_memory
    from fm_pipeline.train.segment import SegmentRefused, SegmentSetupError, run_segment

    from fm_pipeline.config.site import Site
    from fm_pipeline.train.tracking import TrainerTracking

    keep_freed_host_memory()  # no page faults re-growing the heap every step
    # torch's imports leave ~300K objects that live as long as the process: frozen (before the
    # model exists, so a restart's discarded model is still collected), the collector's
    # full passes during training no longer walk them.
    gc.freeze()
    # The worker's entry point: where state lives and where rank 0 logs, from the
    # environment the launcher gave it; passed down from here.
    site, tracking = Site.from_environ(), TrainerTracking.from_env(os.environ)

    @record  # an uncaught exception lands, with its traceback, in torchrun's error file
    def train():
        from fm_pipeline.rundir.lease import LeaseLost
        from fm_pipeline.train.inprocess import InProcessRestarts

        restarts = InProcessRestarts(job)
        resume_from = args.resume_from
        while True:
            try:
                return run_segment(job, site=site, worker=worker, tracking=tracking,
                                   end_step=args.end_step,
                                   resume_from=resume_from, restart_cause=restarts.cause,
                                   planned=args.planned)
            except SegmentSetupError as e:
                # Raised before the first step (a missing data mix, an unusable checkpoint,
                # a bad --end-step); errors while training fall through to @record (exit 1).
                print(f"error: {e}", file=sys.stderr)
                exit_with(exit_codes.BAD_CONFIG, str(e))
            except SegmentRefused as e:  # another segment holds the job (or it cannot be told)
                print(f"error: {e}", file=sys.stderr)
                exit_with(e.exit_code, str(e))
            except LeaseLost as e:  # taken over mid-segment: the other holder goes on
                print(f"error: {e}", file=sys.stderr)
                exit_with(exit_codes.LEASE_HELD, str(e))
            except Exception as e:
                if (why := permanent_reason(e)) is not None:
                    print(f"error: {why}", file=sys.stderr)
                    exit_with(exit_codes.BAD_CONFIG, why)
                if not restarts.possible():
                    raise  # retryable: @record keeps the traceback for the launcher
                failure = restarts.failed(e)
            # Outside the handler: the traceback, and the failed generation's groups with
            # it, are gone, so their connections close and blocked peers fail too.
            if not restarts.rejoin(failure):
                raise failure.error()  # torchrun's restart of the workers
            resume_from = None  # the fast tier's newest, else the durable tiers

    result = train()
    why = result.summary.get("preempt_reason")  # the stop's own reason (a straggler, ...)
    exit_with(result.exit_code, f"{result.exit_reason} at step {result.end_step}"
                                f"{f' ({why})' if why else ''}; "
                                f"checkpoint {result.summary.get('checkpoint')}")


if __name__ == "__main__":
    main()
