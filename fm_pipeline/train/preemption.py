"""Preemption: SIGTERM or a flag file asks the job to checkpoint and leave.

The signal handler only sets a flag: a collective save inside the handler could interleave
with FSDP's collectives. The flag file is for a Kubernetes preStop hook (`touch` it, then the
kubelet's SIGTERM follows). The trainer all-reduces the flag once per step, so every rank
stops after the same step, saves, and exits with exit_codes.PREEMPTED.

Flag file: $FM_PREEMPT_FILE, else <runs_dir>/PREEMPT. It is removed once honoured so the
next segment does not stop at once.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

# A flag file older than this process is a leftover of an earlier segment, not a request.
_PROCESS_START = time.time()
# A signal this process received (a watcher's handler ran): a segment that failed after it
# is not restarted in the process (train.inprocess); torchrun is tearing the workers down.
_signalled: list[str] = []


def signal_received() -> str | None:
    return _signalled[0] if _signalled else None


def preempt_file(runs_dir: Path, named: Path | None = None) -> Path:
    """The flag the launcher named (WorkerEnv.preempt_file), else the job's own."""
    return named or runs_dir / "PREEMPT"


class PreemptionWatcher:
    def __init__(self, flag_file: Path, *, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.flag_file = flag_file
        self.requested_at: float | None = None  # time.monotonic() of the first request
        self.reason: str | None = None
        self._previous = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        _signalled.append(signal.Signals(signum).name)
        self._request(f"signal {signal.Signals(signum).name}")

    def request(self, reason: str) -> None:
        """Ask for a stop from inside the job (e.g. the straggler policy's exclusion)."""
        self._request(reason)

    def _request(self, reason: str) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()
            self.reason = reason

    def requested(self) -> bool:
        """This rank's view (cheap: one stat of the flag file)."""
        if self.requested_at is None:
            try:
                mtime = self.flag_file.stat().st_mtime
            except OSError:
                return False
            if mtime >= _PROCESS_START - 1.0:
                self._request(f"flag file {self.flag_file}")
            else:
                self.consume_flag_file()
        return self.requested_at is not None

    def seconds_since_request(self) -> float | None:
        return None if self.requested_at is None else time.monotonic() - self.requested_at

    def consume_flag_file(self) -> None:
        try:
            self.flag_file.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove preemption flag %s: %s", self.flag_file, e)

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
