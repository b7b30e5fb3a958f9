"""In-process restart: the fast path for a failure that leaves every process alive.

A rank that raises inside the training loop (an injected fault, a bad batch, a collective
that failed because a peer raised) need not take its process down. On gloo each rank tears
its process groups down, the ranks meet on the store their groups were made from, join a
new group and run the segment again in the same process, restoring the fast tier's newest
snapshot (or the durable tiers) as torchrun's in-job restart does. What it saves is the
processes: the failing worker's exit, torchrun's teardown, a new interpreter, its imports.

    restarts = InProcessRestarts(job)
    while True:
        try:
            return run_segment(job, ..., restart_cause=restarts.cause)
        except Exception as e:
            if permanent_reason(e) or not restarts.possible():
                raise                      # torchrun's restart of the workers, or a failure
            failure = restarts.failed(e)
        if not restarts.rejoin(failure):   # outside the handler: the traceback is gone
            raise failure.error()

Not taken: `resilience.inprocess_restart: false`, a failure retrying cannot fix
(train.__main__.permanent_reason), a process that received SIGTERM (torchrun is tearing
the workers down, or a preemption), a process that died (its peers wait `WAIT_S` for it,
then exit to torchrun's restart), the budget spent
(`resilience.inplace_restarts` in-process restarts per process, besides torchrun's), and
NCCL: a rank blocked in a CUDA collective does not see its peer's group go away; aborting
the communicators from a watchdog (as NVIDIA's resiliency extension does) is not built, so
on GPUs every restart is torchrun's.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass

import torch.distributed as dist

log = logging.getLogger(__name__)

WAIT_S = 30.0  # for every rank at the rendezvous; past it a process is taken to be dead


@dataclass
class Failure:
    """A failure kept as text: the exception's traceback would keep the failed generation's
    objects, and its process groups' connections, alive."""

    cause: str
    traceback: str

    def error(self) -> RuntimeError:
        return RuntimeError(f"{self.cause}\n(no in-process restart: not every rank came "
                            f"back; the failure was:)\n{self.traceback}")


class InProcessRestarts:
    def __init__(self, job):
        self.budget = job.resilience.inplace_restarts
        self.enabled = job.resilience.inprocess_restart
        self.made = 0
        self.cause: str | None = None  # this rank's failure before the current generation

    def possible(self) -> bool:
        from fm_pipeline.train.preemption import signal_received

        return (self.enabled and self.made < self.budget and dist.is_initialized()
                and dist.get_backend() == "gloo" and signal_received() is None)

    @staticmethod
    def failed(error: BaseException) -> Failure:
        return Failure(cause=f"{type(error).__name__}: {error}",
                       traceback="".join(traceback.format_exception(error)))

    def rejoin(self, failure: Failure) -> bool:
        """After a retryable failure escaped the segment (its traceback dropped): True when
        every rank has met again (run the segment again), False when it goes to torchrun."""
        from fm_pipeline.parallel.distributed import leave_and_meet

        log.warning("in-process restart %d of %d after %s", self.made + 1, self.budget,
                    failure.cause.splitlines()[0][:200])
        if not leave_and_meet(wait_s=WAIT_S):
            log.error("in-process restart: not every rank came within %.0f s", WAIT_S)
            return False
        self.made += 1
        self.cause = failure.cause
        return True
