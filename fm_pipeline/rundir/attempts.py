"""torchrun's in-place restarts, seen from a worker: which attempt this is, and how the
previous attempt's workers on this node ended (their error files).

    restart_attempt()                  # 0 for the first start, n after n failure restarts
    worker_group_start(node_dir)       # this agent's worker groups started before this one
    previous_attempt()                 # [AttemptRecord(rank, exit_code, reason)] on this node
    deliberate_stop(previous_attempt())   # a stop to keep, not a failure to restart from

torchrun (`--max-restarts`) restarts every worker once any of them exits non-zero, whatever
the code. A preemption by the flag file, a straggler stop (75), a bad config (2) or a lease
held by another segment (3) are decisions, not failures: the restarted workers end the same
way at once (the trainer's entry point). The SIGTERM torchrun sends to the survivors when a
worker died is teardown, not a preemption: a real SIGTERM preemption stops torchrun itself,
which then restarts nothing. Imports nothing heavy: it runs before torch is imported.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.rundir import exit_codes

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# Restarts this worker made inside its process (train.inprocess; set by
# parallel.distributed.leave_and_meet), for code that must not import torch.
INPROCESS_ENV = "FM_INPROCESS_RESTARTS"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
_DELIBERATE = (exit_codes.PREEMPTED, exit_codes.BAD_CONFIG, exit_codes.LEASE_HELD)
TEARDOWN = "signal SIGTERM"
# A worker that failed only because a peer went away (gloo, NCCL, the c10d store): a
# consequence, never the cause, when another worker's own failure is on record.
_PEER_LOSS = re.compile(r"Connection (?:closed|reset) by peer|remote worker crashing|"
                        r"remote process exited|Broken pipe|recvBytes|Socket Timeout", re.I)


def is_peer_loss(reason: str | None) -> bool:
    return bool(reason) and bool(_PEER_LOSS.search(reason))


@dataclass(frozen=True)
class AttemptRecord:
    rank: int | None
    exit_code: int | None  # None: an uncaught exception (torch's @record keeps no code)
    reason: str


def restart_attempt() -> int:
    try:
        return int(os.environ.get(RESTART_COUNT_ENV, "0"))
    except ValueError:
        return 0


def worker_group_start(node_dir: Path) -> int:
    """How many worker groups this worker's agent started before this one, on this local
    rank: every rendezvous round counts. torch's restart count does not count a round that a
    membership change started (a peer's agent re-joining after its own worker failed, a
    spare joining in place of a lost node): the agent that notices the new node first
    restarts without counting, so the same fault counts 1 on one node and 0 on another.
    Kept per (run, agent pid, local rank) under `node_dir` (node-local memory: a new node
    starts at 0); outside torchrun, the restart count."""
    run, local = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("LOCAL_RANK", "0")
    if not run:
        return restart_attempt()
    agent = os.getppid()
    starts = node_dir / ".starts"
    path = starts / f"{_safe(run)}-{agent}-{_safe(local)}"
    try:
        starts.mkdir(parents=True, exist_ok=True)
        before = int(path.read_text()) if path.exists() else 0
        tmp = path.with_name(f"{path.name}.tmp")  # one per local rank, whatever the run id
        tmp.write_text(str(before + 1))
        os.replace(tmp, path)
        if before == 0 and local == "0":
            _forget_dead_agents(starts)
        return before
    except (OSError, ValueError):  # no node-local memory to count in: torch's own count
        return restart_attempt()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", text)


def _forget_dead_agents(starts: Path) -> None:
    for p in starts.iterdir():
        try:
            os.kill(int(p.name.split("-")[-2]), 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except PermissionError:
            pass  # alive, another user's


def previous_attempt() -> list[AttemptRecord]:
    """The error files the previous attempt's workers on this node left (torchrun keeps one
    directory per attempt: <log_dir>/<run>/attempt_<n>/<local_rank>/error.json). A worker
    killed by a signal leaves none."""
    attempt, mine = restart_attempt(), os.environ.get(ERROR_FILE_ENV)
    if attempt < 1 or not mine:
        return []
    here = Path(mine).parent.parent  # .../attempt_<n>
    before = here.parent / f"attempt_{attempt - 1}"
    records = []
    for path in sorted(before.glob("*/error.json")):
        try:
            message = json.loads(path.read_text(encoding="utf-8")).get("message")
        except (OSError, ValueError):
            continue
        if isinstance(message, str):
            records.append(AttemptRecord(rank=None, exit_code=None, reason=message))
            continue
        if not isinstance(message, dict):
            continue
        extra = message.get("extraInfo") or {}
        rank = extra.get("rank")
        if rank is None and path.parent.name.isdigit():  # torch's @record keeps no rank
            rank = int(os.environ.get("GROUP_RANK", "0")) * int(
                os.environ.get("LOCAL_WORLD_SIZE", "1")) + int(path.parent.name)
        records.append(AttemptRecord(
            rank=int(rank) if rank is not None else None, exit_code=message.get("errorCode"),
            reason=str(message.get("message") or "")))
    return records


def deliberate_stop(records: list[AttemptRecord]) -> AttemptRecord | None:
    """The record to end with again when the previous attempt stopped on purpose."""
    for r in records:
        if r.exit_code in _DELIBERATE and not (r.exit_code == exit_codes.PREEMPTED
                                               and TEARDOWN in r.reason):
            return r
    return None


def restart_cause(records: list[AttemptRecord]) -> str:
    """Why the previous attempt failed, as far as this node saw it: the first failure that
    is not a consequence (a peer gone, the agent's teardown)."""
    failures = [r for r in records if r.exit_code not in _DELIBERATE
                and not is_peer_loss(r.reason)]
    if not failures:
        lost = " (the others lost their peer)" if records else ""
        return ("a worker ended without an error record: killed by a signal, the OOM killer, "
                f"or its node was lost{lost}")
    first = failures[0]
    who = f"rank {first.rank}" if first.rank is not None else "a worker"
    code = f" (exit {first.exit_code})" if first.exit_code is not None else ""
    return f"{who}{code}: {first.reason.strip().splitlines()[-1] if first.reason else '?'}"
