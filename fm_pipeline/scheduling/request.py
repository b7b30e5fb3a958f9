"""What the scheduler knows about a job: who asks, for how much, how urgently, and when."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobRequest:
    """A gang request: all of `resources` at once or nothing.

    `seq` is the submission order (smaller = earlier). It never changes, so a preempted
    job that is requeued goes back to its original place in its tenant's queue.
    """

    job_id: str
    tenant: str
    resources: Mapping[str, int] = field(hash=False)
    priority: int
    seq: int

    @classmethod
    def gpus(cls, job_id: str, tenant: str, gpus: int, *, priority: int, seq: int) -> "JobRequest":
        return cls(job_id=job_id, tenant=tenant, resources={"gpu": gpus}, priority=priority, seq=seq)

    @property
    def queue_key(self) -> tuple[int, int]:
        """Order within a tenant: higher priority first, then first come, first served."""
        return (-self.priority, self.seq)
