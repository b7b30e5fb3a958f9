"""Which running jobs a pending job may preempt, and how often a job may be preempted.

Rules (mirrored by the rendered Kueue ClusterQueue `preemption` block):
- same tenant: only jobs of strictly lower priority            (withinClusterQueue: LowerPriority)
- another tenant: only while that tenant is borrowing (usage above its quota), and
  - any priority if the preemptor stays within its own quota    (reclaimWithinCohort: Any)
  - else strictly lower priority                                (borrowWithinCohort: LowerPriority)
  - else fair share: the preemptor's tenant, with the job, must stay strictly below the
    victim's tenant without the victim                          (fairSharing preemption strategy)
Victims are taken lowest priority first, then from the tenant with the highest share,
then the most recently admitted (least progress since its own start); then the set is
made minimal (a victim whose removal is not needed is dropped).
A job that was preempted `max_per_job_per_hour` times in the last hour is not a candidate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from fm_pipeline.scheduling.fair_share import (
    add,
    covers,
    is_borrowing,
    weighted_share,
    within_limit,
)
from fm_pipeline.scheduling.request import JobRequest
from fm_pipeline.scheduling.tenants import TenantsConfig

Reason = Literal["reclaim", "priority", "fair-share"]
HOUR_S = 3600.0


@dataclass(frozen=True)
class Preemption:
    victim: str
    preemptor: str
    reason: Reason


@dataclass(frozen=True)
class RunningJob:
    job: JobRequest
    admitted_at: float


class PreemptionBudget:
    """At most `max_per_hour` preemptions per job in any sliding hour."""

    def __init__(self, max_per_hour: int):
        self.max_per_hour = max_per_hour
        self._times: dict[str, deque[float]] = {}

    def count(self, job_id: str, now: float) -> int:
        times = self._times.get(job_id)
        if not times:
            return 0
        while times and times[0] <= now - HOUR_S:
            times.popleft()
        return len(times)

    def allows(self, job_id: str, now: float) -> bool:
        return self.count(job_id, now) < self.max_per_hour

    def record(self, job_id: str, now: float) -> None:
        self._times.setdefault(job_id, deque()).append(now)

    def forget(self, job_id: str) -> None:
        self._times.pop(job_id, None)


def plan_preemption(
    preemptor: JobRequest,
    *,
    config: TenantsConfig,
    running: Sequence[RunningJob],
    usage: Mapping[str, Mapping[str, int]],
    free: Mapping[str, int],
    eligible: Callable[[str], bool],
) -> list[Preemption] | None:
    """The smallest victim set that lets `preemptor` start, or None if no allowed set exists."""
    tenant = config.tenant(preemptor.tenant)
    pool = config.pool
    usage = {name: dict(u) for name, u in usage.items()}
    need = preemptor.resources
    reclaim = covers(tenant.quota, add(usage[tenant.name], need)) if tenant.quota else False

    def reason_for(victim: JobRequest) -> Reason | None:
        if victim.tenant == preemptor.tenant:
            return "priority" if victim.priority < preemptor.priority else None
        owner = config.tenant(victim.tenant)
        if not is_borrowing(owner, usage[owner.name]):
            return None
        if reclaim:
            return "reclaim"
        if victim.priority < preemptor.priority:
            return "priority"
        theirs = weighted_share(owner, add(usage[owner.name], victim.resources, -1), pool)
        return "fair-share" if mine < theirs else None

    def starts(freed: Mapping[str, int], own_usage: Mapping[str, int]) -> bool:
        return covers(add(free, freed), need) and within_limit(tenant, add(own_usage, need))

    base_own = dict(usage[tenant.name])

    def starts_without_others(victims: list[tuple[RunningJob, Reason]]) -> bool:
        freed = _sum(c.job.resources for c, _ in victims)
        own = _sum(c.job.resources for c, _ in victims if c.job.tenant == tenant.name)
        return starts(freed, add(base_own, own, -1))

    # Other tenants' victims never change the preemptor's own usage: its share is fixed.
    mine = weighted_share(tenant, add(usage[tenant.name], need), pool)
    shares = {t.name: weighted_share(t, usage[t.name], pool) for t in config.tenants}
    order = sorted(
        (r for r in running if eligible(r.job.job_id)),
        key=lambda r: (r.job.priority, -shares[r.job.tenant], -r.admitted_at, -r.job.seq),
    )
    chosen: list[tuple[RunningJob, Reason]] = []
    freed: dict[str, int] = {}
    for candidate in order:
        reason = reason_for(candidate.job)
        if reason is None:
            continue
        chosen.append((candidate, reason))
        freed = add(freed, candidate.job.resources)
        usage[candidate.job.tenant] = add(usage[candidate.job.tenant], candidate.job.resources, -1)
        if starts(freed, usage[tenant.name]):
            break
    else:
        return None
    # Minimal set: drop, newest choice first, any victim the preemptor can start without.
    for item in reversed(chosen[:-1]):
        rest = [c for c in chosen if c is not item]
        if starts_without_others(rest):
            chosen = rest
    return [Preemption(victim=c.job.job_id, preemptor=preemptor.job_id, reason=r) for c, r in chosen]


def _sum(items) -> dict[str, int]:
    total: dict[str, int] = {}
    for resources in items:
        total = add(total, resources)
    return total
