"""The trainer's side of failure reporting: leave the real exit code and reason for the launcher.

torchrun exits 1 whatever its worker's code was, and torch's `@record` writes an error file
only for uncaught exceptions. A worker that exits on purpose (preempted, bad config) calls

    from fm_pipeline.rundir.exit_record import exit_with
    exit_with(75, "preempted at step 37; checkpoint step-00000037 saved")

which writes its torch-elastic error file (TORCHELASTIC_ERROR_FILE, set per worker by
torchrun) and exits with the code. torchrun copies the root cause's file to its own error
file and keeps `errorCode`; the launcher reads either back (outcome.py). Imports nothing
heavy: it runs inside every worker.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

# Kubernetes keeps only the first 4096 bytes of a termination message: code and reason go
# first, and the traceback is capped.
MAX_TRACEBACK_CHARS = 2000


def exit_record(exit_code: int, reason: str, *, traceback_text: str | None = None) -> dict:
    """The torch-elastic error-file format, with errorCode first so truncation keeps it."""
    extra = {"timestamp": str(int(time.time())), "time_ns": time.time_ns()}
    if os.environ.get("RANK") is not None:
        extra["rank"] = int(os.environ["RANK"])
    extra["py_callstack"] = (traceback_text or reason)[-MAX_TRACEBACK_CHARS:]
    return {"message": {"errorCode": exit_code, "message": reason, "extraInfo": extra}}


def write_exit_record(exit_code: int, reason: str, *, traceback_text: str | None = None,
                      termination_log: Path | None = None) -> str | None:
    """Write this worker's error file; returns its path, or None outside torchrun.
    `termination_log`: the pod's (config.worker_env.WorkerEnv), where it runs in one."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return None
    record = exit_record(exit_code, reason, traceback_text=traceback_text)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)  # torchrun may read it the moment we exit
    if termination_log is not None:
        _termination_message(record, termination_log)
    return path


def _termination_message(record: dict, path: Path) -> None:
    """In a pod (the container's terminationMessagePath) the first rank to exit on purpose
    leaves its record as the pod's termination message, so the cluster shows the real code
    and reason (torchrun's own exit code is 1)."""
    try:
        with open(path, "r+", encoding="utf-8") as f:  # the kubelet's file: never replace it
            if f.read(1):
                return  # another rank got there first: its failure is the root cause
            f.seek(0)
            f.write(json.dumps(record)[:4096])
    except OSError:
        pass  # the message is a convenience; the error files above are the record


def exit_with(exit_code: int, reason: str, *, traceback_text: str | None = None,
              termination_log: Path | None = None) -> NoReturn:
    if exit_code != 0:
        write_exit_record(exit_code, reason, traceback_text=traceback_text,
                          termination_log=termination_log)
    sys.stdout.flush()
    sys.stderr.flush()
    # The interpreter's last collections walk every object torch's imports made (~1.2 s of
    # CPU per worker, more than many short segments train); frozen, they are skipped.
    # atexit handlers still run; the process ends, so nothing frozen needs collecting.
    gc.freeze()
    sys.exit(exit_code)
