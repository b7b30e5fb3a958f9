"""Multi-tenant mode: replay a job trace through the project's fair-share/preemption policy.

    from fm_pipeline.sim.multitenant import replay
    from fm_pipeline.sim.trace import cluster_tenants, synthetic_trace
    tenants = cluster_tenants(pool_gpus=4096)
    trace = synthetic_trace(tenants, n_jobs=400, seed=0)
    result = replay(trace, tenants)        # utilisation, queue wait, preemptions, per tenant

The policy is `fm_pipeline.scheduling.FairSharePolicy`, the very object the REST control
plane uses (gang admission, weighted DRF between tenants, bounded preemption with requeue
at the original position); the simulator only drives its clock and plays the jobs: a job
admitted holds its GPUs through `startup_s` (launch + restore), then works; a preempted
one checkpoints for `stop_s` while still holding its GPUs (SIGTERM -> exit), and loses
the work since its last periodic checkpoint if that takes longer than the policy's grace
period (SIGKILL). The policy is re-run whenever something changes and every
`schedule_every_s` (a reconcile loop: a preemption budget can free up with time alone).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any, Callable, Iterable

import numpy as np
import simpy

from fm_pipeline.scheduling import FairSharePolicy, JobRequest, Preemption, TenantsConfig
from fm_pipeline.sim.single_job import CountingEnvironment
from fm_pipeline.sim.trace import TraceJob


@dataclass(frozen=True)
class TenantStats:
    jobs: int
    completed: int
    gpu_hours: float  # held (running, starting, stopping)
    queue_wait_mean_h: float
    queue_wait_p95_h: float
    preempted: int  # times this tenant's jobs were preempted


@dataclass(frozen=True)
class ReplayResult:
    pool_gpus: int
    wall_hours: float
    jobs: int
    completed: int
    utilisation: float  # GPU-hours held / pool GPU-hours, while jobs keep arriving
    utilisation_overall: float  # the same until the last job ends (the drain included)
    productive_utilisation: float  # kept work / pool GPU-hours, until the last job ends
    queue_wait_mean_h: float
    queue_wait_p50_h: float
    queue_wait_p95_h: float
    jct_mean_h: float  # submit -> completion, completed jobs
    preemptions: int
    preemptions_by_reason: dict[str, int]
    lost_gpu_hours: dict[str, float]  # startup, stop (checkpoint at SIGTERM), killed_work
    tenants: dict[str, TenantStats]
    events_simulated: int
    utilisation_timeline: list[tuple[float, float]]  # (hours, fraction of the pool held)

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not timeline:
            out.pop("utilisation_timeline")
        return out


class _Replay:
    def __init__(self, trace: list[TraceJob], config: TenantsConfig, *, startup_s: float,
                 stop_s: float, checkpoint_interval_s: float, schedule_every_s: float,
                 progress: Callable[[], None] | None):
        self.env = CountingEnvironment()
        self.config = config
        self.policy = FairSharePolicy(config, clock=lambda: self.env.now)
        self.trace = sorted(trace, key=lambda j: (j.submit_s, j.job_id))
        self.jobs = {j.job_id: j for j in self.trace}
        self.seq = {j.job_id: i for i, j in enumerate(self.trace)}  # submission order
        if len(self.jobs) != len(self.trace):
            raise ValueError("trace job_ids must be unique")
        self.startup_s, self.stop_s = startup_s, stop_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self.schedule_every_s = schedule_every_s
        self.progress = progress
        self.grace_s = config.preemption.grace_s
        self.remaining = {j.job_id: j.duration_s for j in self.trace}
        self.first_admit: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.procs: dict[str, simpy.Process] = {}
        self.lost: dict[str, float] = defaultdict(float)
        self.preemptions: list[Preemption] = []
        self.preempted_tenant: Counter = Counter()
        self.held = 0
        self.timeline: list[tuple[float, float]] = [(0.0, 0.0)]

    def run(self, horizon_s: float | None) -> ReplayResult:
        probe = FairSharePolicy(self.config, clock=lambda: 0.0)
        for job in self.trace:  # refuse jobs that could never start before simulating
            probe.submit(self._request(job))
            probe.cancel(job.job_id)
        self.env.process(self._arrivals())
        self.env.process(self._reconcile())
        self.env.run(until=horizon_s)
        return self._result()

    def _request(self, job: TraceJob) -> JobRequest:
        return JobRequest.gpus(job.job_id, job.tenant, job.gpus, priority=job.priority,
                               seq=self.seq[job.job_id])

    def _arrivals(self):
        for job in self.trace:
            yield self.env.timeout(max(job.submit_s - self.env.now, 0.0))
            self.policy.submit(self._request(job))
            self._schedule()

    def _reconcile(self):
        while len(self.done) < len(self.trace):
            yield self.env.timeout(self.schedule_every_s)
            if self.policy.pending():  # only a queue can be unblocked by time alone
                self._schedule()

    def _schedule(self) -> None:
        decision = self.policy.schedule()
        for job_id in decision.admitted:
            self.first_admit.setdefault(job_id, self.env.now)
            self.procs[job_id] = self.env.process(self._run(self.jobs[job_id]))
        for p in decision.preempted:
            self.preemptions.append(p)
            self.preempted_tenant[self.jobs[p.victim].tenant] += 1
            self.procs[p.victim].interrupt(p)

    def _hold(self, gpus: int) -> None:
        self.held += gpus
        self.timeline.append((self.env.now, self.held))

    def _run(self, job: TraceJob):
        start = self.env.now
        self._hold(job.gpus)
        working_since = None
        try:
            yield self.env.timeout(self.startup_s)
            self.lost["startup"] += job.gpus * self.startup_s
            working_since = self.env.now
            yield self.env.timeout(self.remaining[job.job_id])
            self.remaining[job.job_id] = 0.0
            self.done[job.job_id] = self.env.now
            self.policy.release(job.job_id)
        except simpy.Interrupt:
            if working_since is None:
                self.lost["startup"] += job.gpus * (self.env.now - start)
            else:
                self._keep_work(job, self.env.now - working_since)
            stop = min(self.stop_s, self.grace_s)
            yield self.env.timeout(stop)
            self.lost["stop"] += job.gpus * stop
            self.policy.requeue(job.job_id)
        finally:
            self._hold(-job.gpus)
            if self.progress is not None and job.job_id in self.done:
                self.progress()
        self._schedule()

    def _keep_work(self, job: TraceJob, worked_s: float) -> None:
        if self.stop_s <= self.grace_s:
            kept = worked_s  # it saved a checkpoint at SIGTERM
        else:  # SIGKILL before the save finished: back to its last periodic checkpoint
            kept = worked_s - math.fmod(worked_s, self.checkpoint_interval_s)
            self.lost["killed_work"] += job.gpus * (worked_s - kept)
        self.remaining[job.job_id] -= kept

    def _result(self) -> ReplayResult:
        now = self.env.now
        if len(self.done) == len(self.trace):  # the reconcile loop may tick past the end
            now = max(self.done.values())
        pool = self.config.pool["gpu"]
        capacity = pool * now
        arrivals_end = min(self.trace[-1].submit_s, now)
        productive = sum((j.duration_s - self.remaining[j.job_id]) * j.gpus for j in self.trace)
        waits = {j.job_id: (self.first_admit.get(j.job_id, now) - j.submit_s) / 3600
                 for j in self.trace if j.submit_s <= now}
        jct = [(self.done[j] - self.jobs[j].submit_s) / 3600 for j in self.done]
        tenants = {}
        for name in self.config.tenant_names:
            mine = [j for j in self.trace if j.tenant == name and j.job_id in waits]
            w = [waits[j.job_id] for j in mine]
            tenants[name] = TenantStats(
                jobs=len(mine),
                completed=sum(j.job_id in self.done for j in mine),
                gpu_hours=self.policy.resource_seconds(name).get("gpu", 0.0) / 3600,
                queue_wait_mean_h=fmean(w) if w else 0.0,
                queue_wait_p95_h=float(np.percentile(w, 95)) if w else 0.0,
                preempted=self.preempted_tenant[name],
            )
        all_waits = list(waits.values())
        lost = {k: v / 3600 for k, v in self.lost.items()}
        return ReplayResult(
            pool_gpus=pool,
            wall_hours=now / 3600,
            jobs=len(self.trace),
            completed=len(self.done),
            utilisation=self._held_integral(arrivals_end) / (pool * arrivals_end)
            if arrivals_end > 0 else 0.0,
            utilisation_overall=self._held_integral(now) / capacity if capacity else 0.0,
            productive_utilisation=productive / capacity if capacity else 0.0,
            queue_wait_mean_h=fmean(all_waits) if all_waits else 0.0,
            queue_wait_p50_h=float(np.percentile(all_waits, 50)) if all_waits else 0.0,
            queue_wait_p95_h=float(np.percentile(all_waits, 95)) if all_waits else 0.0,
            jct_mean_h=fmean(jct) if jct else math.nan,
            preemptions=len(self.preemptions),
            preemptions_by_reason=dict(Counter(p.reason for p in self.preemptions)),
            lost_gpu_hours={"startup": 0.0, "stop": 0.0, "killed_work": 0.0, **lost},
            tenants=tenants,
            events_simulated=self.env.events_processed,
            utilisation_timeline=[(t / 3600, h / pool) for t, h in self.timeline],
        )

    def _held_integral(self, until: float) -> float:
        """GPU-seconds held from 0 to `until` (the timeline is a step function)."""
        total, (t0, h0) = 0.0, self.timeline[0]
        for t, h in self.timeline[1:]:
            if t >= until:
                break
            total += h0 * (t - t0)
            t0, h0 = t, h
        return total + h0 * max(until - t0, 0.0)


def replay(trace: Iterable[TraceJob], config: TenantsConfig, *, horizon_s: float | None = None,
           startup_s: float = 300.0, stop_s: float = 60.0, checkpoint_interval_s: float = 1800.0,
           schedule_every_s: float = 300.0,
           progress: Callable[[], None] | None = None) -> ReplayResult:
    """Replay `trace` through `FairSharePolicy(config)`; None horizon: until all complete."""
    trace = list(trace)
    if not trace:
        raise ValueError("the trace holds no jobs")
    for name, value in (("startup_s", startup_s), ("stop_s", stop_s)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if checkpoint_interval_s <= 0 or schedule_every_s <= 0:
        raise ValueError("checkpoint_interval_s and schedule_every_s must be > 0")
    unknown = sorted({j.tenant for j in trace} - set(config.tenant_names))
    if unknown:
        raise ValueError(f"trace names tenants the config lacks: {', '.join(unknown)}")
    sim = _Replay(trace, config, startup_s=startup_s, stop_s=stop_s,
                  checkpoint_interval_s=checkpoint_interval_s,
                  schedule_every_s=schedule_every_s, progress=progress)
    return sim.run(horizon_s)
