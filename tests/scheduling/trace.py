"""A small discrete-event driver for the policy: jobs that step, checkpoint and get preempted.

Time is a simulated clock (no sleeping). A job needs `steps` steps of `step_s` seconds;
it writes a checkpoint every `ckpt_every` steps. When preempted it gets SIGTERM, saves a
checkpoint at the step it is on (the agreed step) within `save_s` seconds and exits; if
the save takes longer than the grace period it is killed and resumes from its last
periodic checkpoint. A requeued job resumes from its last checkpoint.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from fm_pipeline.scheduling import FairSharePolicy, JobRequest


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SimJob:
    request: JobRequest
    submit_at: float
    steps: int
    step_s: float = 60.0
    ckpt_every: int = 10
    save_s: float = 30.0
    # state
    checkpoint_step: int = 0
    started_at: float | None = None
    start_step: int = 0
    generation: int = 0
    finished_at: float | None = None
    steps_computed: int = 0  # every step executed, including ones lost to a kill
    preemptions: int = 0
    lost_steps: int = 0
    history: list[str] = field(default_factory=list)

    def step_at(self, now: float) -> int:
        assert self.started_at is not None
        return min(self.steps, self.start_step + int((now - self.started_at) // self.step_s))


class TraceRunner:
    def __init__(self, policy: FairSharePolicy, clock: Clock, *, grace_s: float) -> None:
        self.policy = policy
        self.clock = clock
        self.grace_s = grace_s
        self.jobs: dict[str, SimJob] = {}
        self._events: list[tuple[float, int, str, str, int]] = []
        self._order = 0
        self.gpu_seconds: dict[str, float] = {t: 0.0 for t in policy.config.tenant_names}
        self.preempted: list = []

    def add(self, job: SimJob) -> None:
        self.jobs[job.request.job_id] = job
        self._push(job.submit_at, "submit", job.request.job_id, 0)

    def _push(self, at: float, kind: str, job_id: str, generation: int) -> None:
        self._order += 1
        heapq.heappush(self._events, (at, self._order, kind, job_id, generation))

    def run(self, *, until: float, window: tuple[float, float] | None = None) -> None:
        lo, hi = window or (0.0, until)
        while self._events and self._events[0][0] <= until:
            at = self._events[0][0]
            self._integrate(self.clock.now, at, lo, hi)
            self.clock.now = at
            while self._events and self._events[0][0] == at:
                _, _, kind, job_id, generation = heapq.heappop(self._events)
                self._handle(kind, self.jobs[job_id], generation)
            self._apply(self.policy.schedule())
        self._integrate(self.clock.now, until, lo, hi)
        self.clock.now = max(self.clock.now, until)

    def _integrate(self, t0: float, t1: float, lo: float, hi: float) -> None:
        span = max(0.0, min(t1, hi) - max(t0, lo))
        for tenant in self.gpu_seconds:
            self.gpu_seconds[tenant] += self.policy.usage(tenant).get("gpu", 0) * span

    def _handle(self, kind: str, job: SimJob, generation: int) -> None:
        jid = job.request.job_id
        if generation != job.generation:
            return  # a finish scheduled before the job was preempted
        now = self.clock.now
        if kind == "submit":
            self.policy.submit(job.request)
            job.history.append("queued")
        elif kind == "finish":
            job.steps_computed += job.steps - job.start_step
            job.checkpoint_step = job.steps
            job.finished_at = now
            job.history.append("finished")
            self.policy.release(jid)
        elif kind == "stopped":
            self.policy.requeue(jid)
            job.history.append("requeued")

    def _apply(self, decision) -> None:
        now = self.clock.now
        for jid in decision.admitted:
            job = self.jobs[jid]
            job.started_at, job.start_step = now, job.checkpoint_step
            job.generation += 1
            job.history.append(f"started@{job.start_step}")
            remaining = (job.steps - job.start_step) * job.step_s
            self._push(now + remaining, "finish", jid, job.generation)
        for p in decision.preempted:
            self.preempted.append(p)
            job = self.jobs[p.victim]
            reached = job.step_at(now)  # SIGTERM: finish the current step's bookkeeping, save
            job.steps_computed += reached - job.start_step
            job.preemptions += 1
            job.generation += 1
            if job.save_s <= self.grace_s:
                job.checkpoint_step = reached  # the agreed step: nothing lost
                stop_after = job.save_s
            else:  # killed at the end of the grace period: back to the last periodic checkpoint
                periodic = max(job.start_step, reached // job.ckpt_every * job.ckpt_every)
                job.lost_steps += reached - periodic
                job.checkpoint_step = periodic
                stop_after = self.grace_s
            job.history.append(f"preempted@{reached}->ckpt{job.checkpoint_step}")
            self._push(now + stop_after, "stopped", p.victim, job.generation)
