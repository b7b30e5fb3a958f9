"""The admission policy: a deterministic state machine over a queue and a resource pool.

It decides; it never waits, sleeps or launches. The caller starts what `schedule()`
admits, stops (SIGTERM -> checkpoint -> exit) what it preempts, and reports back with
`release()` (a running job ended) or `requeue()` (a preempted job has exited).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fm_pipeline.scheduling.fair_share import add, covers, weighted_share, within_limit
from fm_pipeline.scheduling.preemption import (
    Preemption,
    PreemptionBudget,
    RunningJob,
    plan_preemption,
)
from fm_pipeline.scheduling.request import JobRequest
from fm_pipeline.scheduling.tenants import TenantsConfig


class AdmissionError(ValueError):
    """A request the pool can never satisfy, or a verb on a job in the wrong state."""


@dataclass(frozen=True)
class Decision:
    """One scheduling cycle's outcome, in the order the policy took the decisions."""

    admitted: tuple[str, ...] = ()
    preempted: tuple[Preemption, ...] = ()


@dataclass
class _Running:
    job: JobRequest
    admitted_at: float
    stopping: bool = False  # preempted, still holding its resources until it exits


class FairSharePolicy:
    """Gang admission with weighted DRF between tenants, priority then FIFO within one.

    `clock()` returns seconds (wall or simulated); it is read only inside verbs, so a
    simulator drives time by advancing its own clock between calls.
    """

    def __init__(self, config: TenantsConfig, *, clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self._pending: dict[str, JobRequest] = {}
        self._queues: dict[str, list[tuple[tuple[int, int], str]]] = {
            t: [] for t in config.tenant_names
        }  # per tenant, sorted by queue_key: the head is [0]
        self._running: dict[str, _Running] = {}
        self._nominated: dict[str, set[str]] = {}  # preemptor -> victims still stopping
        self._usage: dict[str, dict[str, int]] = {t: {} for t in config.tenant_names}
        self._budget = PreemptionBudget(config.preemption.max_per_job_per_hour)
        self._resource_seconds: dict[str, dict[str, float]] = {t: {} for t in config.tenant_names}
        # Running jobs no tenant of this config owns (a tenant removed while its job ran):
        # scheduled by nobody, but what they hold is not free.
        self._outside: dict[str, dict[str, int]] = {}

    # -- verbs -------------------------------------------------------------------------

    def submit(self, job: JobRequest) -> None:
        """Queue `job`; raises AdmissionError if it could never start."""
        self.check(job)
        self._enqueue(job)

    def restore_running(self, job: JobRequest, *, admitted_at: float) -> None:
        """Re-enter a job that was already running when the caller restarted."""
        self.check(job)
        self._start(job, admitted_at)

    def hold_outside(self, job_id: str, resources: dict[str, int]) -> None:
        """Count what a running job this config cannot place (its tenant is gone, or it
        is bigger than the pool now) holds until `release_outside`."""
        self._outside[job_id] = dict(resources)

    def release_outside(self, job_id: str) -> None:
        self._outside.pop(job_id, None)

    def cancel(self, job_id: str) -> None:
        """Drop a pending job (a running one is stopped by the caller, then `release`d)."""
        if job_id not in self._pending:
            raise AdmissionError(f"job {job_id} is not pending")
        self._dequeue(job_id)
        self._budget.forget(job_id)

    def release(self, job_id: str) -> None:
        """A running job ended (finished, failed or cancelled): free its resources."""
        self._account(self._pop_running(job_id))
        self._budget.forget(job_id)
        self._drop_victim(job_id)

    def requeue(self, job_id: str) -> None:
        """A preempted job exited after its checkpoint: back to its original queue position."""
        run = self._pop_running(job_id)
        self._account(run)
        self._drop_victim(job_id)
        self._enqueue(run.job)

    def schedule(self) -> Decision:
        """Admit every head that fits, in fair-share order; plan preemptions for the rest.
        With `admission: kueue` every pending job is handed over at once, in that order:
        Kueue's ClusterQueues decide the rest, so planning preemptions here would make two
        schedulers race for the same victims."""
        now = self._clock()
        admitted: list[str] = []
        if self.config.admission == "kueue":
            while heads := self._heads():
                job = min(heads, key=self._admission_key)
                self._admit(job, now)
                admitted.append(job.job_id)
            return Decision(admitted=tuple(admitted))
        preempted: list[Preemption] = []
        blocked: set[str] = set()
        self._drop_stale_nominations()
        while heads := [j for j in self._heads() if j.tenant not in blocked]:
            job = min(heads, key=self._admission_key)
            if self._fits(job):
                self._admit(job, now)
                admitted.append(job.job_id)
                continue
            blocked.add(job.tenant)  # strict order inside a tenant: its head waits first
            if self._nominated.get(job.job_id):
                continue  # its victims are still checkpointing
            plan = plan_preemption(
                job, config=self.config, running=self._candidates(), usage=self._usage_all(),
                free=self._free_for(job), eligible=lambda jid: self._budget.allows(jid, now),
            )
            if plan:
                for p in plan:
                    self._running[p.victim].stopping = True
                    self._budget.record(p.victim, now)
                self._nominated[job.job_id] = {p.victim for p in plan}
                preempted.extend(plan)
        return Decision(admitted=tuple(admitted), preempted=tuple(preempted))

    # -- queries -----------------------------------------------------------------------

    def queue_position(self, job_id: str) -> int | None:
        """1-based place in its tenant's queue (priority, then submission); None if not queued."""
        job = self._pending.get(job_id)
        if job is None:
            return None
        return 1 + bisect.bisect_left(self._queues[job.tenant], (job.queue_key, job_id))

    def pending(self, tenant: str | None = None) -> list[JobRequest]:
        jobs = [j for j in self._pending.values() if tenant in (None, j.tenant)]
        return sorted(jobs, key=lambda j: (j.tenant, j.queue_key))

    def running(self) -> list[str]:
        return sorted(self._running, key=lambda jid: self._running[jid].job.seq)

    def is_stopping(self, job_id: str) -> bool:
        run = self._running.get(job_id)
        return bool(run and run.stopping)

    def usage(self, tenant: str) -> dict[str, int]:
        """Resources held by the tenant's running (and stopping) jobs."""
        return dict(self._usage[tenant])

    def share(self, tenant: str) -> float:
        return weighted_share(self.config.tenant(tenant), self.usage(tenant), self.config.pool)

    def resource_seconds(self, tenant: str) -> dict[str, float]:
        """Resources x seconds held by the tenant's jobs so far (running ones up to now)."""
        total = dict(self._resource_seconds[tenant])
        now = self._clock()
        for run in self._running.values():
            if run.job.tenant == tenant:
                for res, amount in run.job.resources.items():
                    total[res] = total.get(res, 0.0) + amount * (now - run.admitted_at)
        return total

    def preemptions_last_hour(self, job_id: str) -> int:
        return self._budget.count(job_id, self._clock())

    # -- internals ---------------------------------------------------------------------

    def check(self, job: JobRequest) -> None:
        """Raise AdmissionError unless `job` could ever start (tenant, resources, limits)."""
        if job.job_id in self._pending or job.job_id in self._running:
            raise AdmissionError(f"job {job.job_id} is already queued or running")
        try:
            tenant = self.config.tenant(job.tenant)
        except KeyError:
            raise AdmissionError(f"unknown tenant {job.tenant!r}") from None
        if not job.resources or any(a <= 0 for a in job.resources.values()):
            raise AdmissionError(f"job {job.job_id} must request a positive amount of something")
        unknown = sorted(set(job.resources) - set(self.config.pool))
        if unknown:
            raise AdmissionError(f"job {job.job_id} requests {unknown}, which the pool lacks")
        if not covers(self.config.pool, job.resources):
            raise AdmissionError(
                f"job {job.job_id} requests {dict(job.resources)}, more than the whole pool "
                f"{dict(self.config.pool)}: it could never start"
            )
        if not within_limit(tenant, job.resources):
            raise AdmissionError(
                f"job {job.job_id} requests {dict(job.resources)}, more than tenant "
                f"{tenant.name}'s quota {tenant.quota} plus borrowing limit {tenant.borrowing_limit}"
            )

    def _enqueue(self, job: JobRequest) -> None:
        self._pending[job.job_id] = job
        bisect.insort(self._queues[job.tenant], (job.queue_key, job.job_id))

    def _dequeue(self, job_id: str) -> None:
        job = self._pending.pop(job_id)
        self._queues[job.tenant].remove((job.queue_key, job_id))
        self._nominated.pop(job_id, None)

    def _heads(self) -> Iterable[JobRequest]:
        return [self._pending[queue[0][1]] for queue in self._queues.values() if queue]

    def _admission_key(self, job: JobRequest) -> tuple:
        tenant = self.config.tenant(job.tenant)
        after = weighted_share(tenant, add(self.usage(job.tenant), job.resources), self.config.pool)
        return (after, -job.priority, job.seq)

    def _usage_all(self) -> dict[str, dict[str, int]]:
        return {t: self.usage(t) for t in self.config.tenant_names}

    def _free(self) -> dict[str, int]:
        free = dict(self.config.pool)
        for used in [*self._usage.values(), *self._outside.values()]:
            free = add(free, used, -1)
        return free

    def _held(self, preemptor: str) -> dict[str, int]:
        """Free capacity kept for a nominated job: what its stopping victims will not cover."""
        need = self._pending[preemptor].resources
        coming: dict[str, int] = {}
        for victim in self._nominated[preemptor]:
            coming = add(coming, self._running[victim].job.resources)
        return {res: max(0, amount - coming.get(res, 0)) for res, amount in need.items()}

    def _free_for(self, job: JobRequest) -> dict[str, int]:
        free = self._free()
        for preemptor in self._nominated:
            if preemptor != job.job_id:
                free = add(free, self._held(preemptor), -1)
        return {res: max(0, amount) for res, amount in free.items()}

    def _fits(self, job: JobRequest) -> bool:
        tenant = self.config.tenant(job.tenant)
        return covers(self._free_for(job), job.resources) and within_limit(
            tenant, add(self.usage(job.tenant), job.resources)
        )

    def _admit(self, job: JobRequest, now: float) -> None:
        self._dequeue(job.job_id)
        self._start(job, now)

    def _start(self, job: JobRequest, now: float) -> None:
        self._running[job.job_id] = _Running(job, now)
        self._usage[job.tenant] = add(self._usage[job.tenant], job.resources)

    def _candidates(self) -> list[RunningJob]:
        return [
            RunningJob(run.job, run.admitted_at)
            for run in self._running.values()
            if not run.stopping
        ]

    def _pop_running(self, job_id: str) -> _Running:
        run = self._running.pop(job_id, None)
        if run is None:
            raise AdmissionError(f"job {job_id} is not running")
        self._usage[run.job.tenant] = add(self._usage[run.job.tenant], run.job.resources, -1)
        return run

    def _account(self, run: _Running) -> None:
        held = self._clock() - run.admitted_at
        totals = self._resource_seconds[run.job.tenant]
        for res, amount in run.job.resources.items():
            totals[res] = totals.get(res, 0.0) + amount * held

    def _drop_stale_nominations(self) -> None:
        # A job that is no longer its tenant's head (a higher-priority one arrived) gives
        # its held capacity back; the new head plans its own preemption if it needs one.
        heads = {j.job_id for j in self._heads()}
        for preemptor in [p for p in self._nominated if p not in heads]:
            del self._nominated[preemptor]

    def _drop_victim(self, job_id: str) -> None:
        for victims in self._nominated.values():
            victims.discard(job_id)
