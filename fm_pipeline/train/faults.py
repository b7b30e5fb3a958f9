"""Fault injection hooks in the training step, for drills and tests (off unless set).

    FM_FAULT_SLOW_RANKS="1:0.2,3:0.05"   global rank 1 sleeps 0.2 s (rank 3: 0.05 s) in the
                                          compute section of every step: a straggler
    FM_FAULT_FAIL_AT="1:25"               global rank 1 raises InjectedFault instead of
                                          running the step after step 25: a crash (once
                                          per segment: torchrun's in-job restart of the
                                          workers trains through it)
"""

from __future__ import annotations

import os

SLOW_RANKS_ENV = "FM_FAULT_SLOW_RANKS"
FAIL_AT_ENV = "FM_FAULT_FAIL_AT"


class InjectedFault(RuntimeError):
    """A failure asked for by FM_FAULT_FAIL_AT (resume drills, the demo)."""


def slow_rank_delay(rank: int) -> float:
    """Seconds this rank sleeps per step (FM_FAULT_SLOW_RANKS), 0 when not listed."""
    spec = os.environ.get(SLOW_RANKS_ENV, "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        r, sep, seconds = item.partition(":")
        try:
            if int(r) == rank:
                return float(seconds)
        except ValueError:
            raise ValueError(f"{SLOW_RANKS_ENV}={spec!r}: expected RANK:SECONDS[,...], "
                             "e.g. 1:0.2") from None
    return 0.0


def injected_failure_step(rank: int) -> int | None:
    """The step after which this rank fails (FM_FAULT_FAIL_AT), None when not this rank or
    in a restarted attempt, of the workers or in the process (the fault happened; the
    restart is what is being tested)."""
    from fm_pipeline.rundir.attempts import INPROCESS_ENV, restart_attempt

    spec = os.environ.get(FAIL_AT_ENV, "").strip()
    if not spec or restart_attempt() > 0 or os.environ.get(INPROCESS_ENV, "0") != "0":
        return None
    r, sep, step = spec.partition(":")
    if not sep or not r.strip().isdigit() or not step.strip().isdigit():
        raise ValueError(f"{FAIL_AT_ENV}={spec!r}: expected RANK:STEP, e.g. 1:25")
    return int(step) if int(r) == rank else None
