"""No process outlives the segment that started it: every process a local segment starts
carries the segment's tag in its environment, and whatever still carries it once torchrun
has exited is ended.

    tag, env = tag_segment()                  # added to torchrun's environment
    ... torchrun runs, exits (finished, failed, preempted, timed out, interrupted) ...
    end_tagged(tag, grace_s=2)                # orphans: SIGTERM, then SIGKILL
    reap_orphans()                            # at start-up: segments whose launcher died

Why a tag, not a process group: torchrun starts each worker in a session of its own, a
worker's helpers may start theirs, and a process whose parent died is re-parented to PID 1,
so neither the group nor the tree still finds it. The environment is inherited by every
descendant unless one clears it on purpose. The owner (launching pid and its start time, so
a reused pid is not mistaken for it) lets a later launcher end what a crash left.
Linux only (/proc); torch-free.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

TAG_ENV = "FM_SEGMENT_TAG"
OWNER_ENV = "FM_SEGMENT_OWNER"


def tag_segment() -> tuple[str, dict[str, str]]:
    """A new tag and the environment that carries it and this process as its owner."""
    tag = uuid.uuid4().hex
    return tag, {TAG_ENV: tag, OWNER_ENV: owner_id(os.getpid())}


def owner_id(pid: int) -> str:
    return f"{pid}:{_start_ticks(pid)}"


def tagged(tag: str | None = None, *, variable: str = TAG_ENV) -> dict[int, tuple[str, str]]:
    """pid -> (tag, owner) of every live process carrying a segment tag (only `tag`'s); the
    dev cluster tags its processes with a variable of its own."""
    found = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, a kernel thread, or another user's
            continue
        values = dict(_pairs(environ, (variable, OWNER_ENV)))
        if variable in values and (tag is None or values[variable] == tag):
            if _state(int(entry.name)) != "Z":  # a zombie is already dead
                found[int(entry.name)] = (values[variable], values.get(OWNER_ENV, ""))
    return found


def end_tagged(tag: str, *, grace_s: float = 2.0, variable: str = TAG_ENV) -> list[int]:
    """End every process still carrying `tag`: SIGTERM, then SIGKILL after `grace_s`.
    Returns the pids it found."""
    return _end(list(tagged(tag, variable=variable)), grace_s=grace_s,
                why=f"segment {tag[:8]}" if variable == TAG_ENV else f"{variable}={tag[:8]}")


def reap_orphans(*, grace_s: float = 10.0) -> list[int]:
    """End the tagged processes whose launcher is gone (died, or its pid reused): what a
    killed launcher, API server or run worker left. Returns their pids."""
    orphans = [pid for pid, (_, owner) in tagged().items() if not _owner_alive(owner)]
    return _end(orphans, grace_s=grace_s, why="their launcher is gone")


def _end(pids: list[int], *, grace_s: float, why: str) -> list[int]:
    if not pids:
        return []
    log.warning("ending %d tagged process(es) (%s): %s", len(pids), why,
                ", ".join(map(str, pids)))
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    signal_all([p for p in pids if _alive(p)], signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # SIGKILL is delivered, not yet done: wait for it
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.02)
    return pids


def signal_all(pids: list[int], sig: int) -> None:
    """Send `sig` to each of `pids`, skipping those already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state != "Z"


def _owner_alive(owner: str) -> bool:
    pid, _, ticks = owner.partition(":")
    if not pid.isdigit():
        return False
    return _start_ticks(int(pid)) == ticks and _alive(int(pid))


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name ([] when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(pid: int) -> str | None:
    fields = proc_stat(pid)
    return fields[0] if fields else None


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = proc_stat(pid)
    return fields[19] if len(fields) > 19 else ""


def _pairs(environ: bytes, names: tuple[str, ...]):
    for item in environ.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in names:
            yield key.decode(), value.decode(errors="replace")
