"""Servers started by tests run in their own process group (start_new_session=True), so
one signal reaches every process they spawned (workers, code servers, renderers)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, *, grace_s: float = 30) -> None:
    """SIGTERM the group, SIGKILL it after `grace_s`; a no-op when it already exited."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
