"""Run a command that holds an exclusive lock for its whole life (the lock survives exec):

    python -m fm_pipeline.deploy.exclusive DAGSTER_HOME/daemon.lock -- dagster-daemon run ...

One dagster-daemon per instance: two control planes on one FM_HOME each start "the daemon";
the second finds the lock held by the first's daemon and exits ALREADY_RUNNING at once. The
lock goes with the daemon process, whoever started it and however it ends.
"""

from __future__ import annotations

import fcntl
import os
import sys

ALREADY_RUNNING = 3


def held(lock) -> bool:
    """Some process holds `lock` now (its daemon runs)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it if we got it
    return False


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        print("usage: python -m fm_pipeline.deploy.exclusive LOCK -- COMMAND ...",
              file=sys.stderr)
        return 2
    lock, command = argv[0], argv[2:]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        print(f"{lock} is held by pid {holder}: {command[0]} already runs for it",
              file=sys.stderr)
        return ALREADY_RUNNING
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.set_inheritable(fd, True)  # the command inherits the descriptor, and with it the lock
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
