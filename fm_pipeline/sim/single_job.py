"""Discrete-event simulation of one synchronous training job on thousands of GPUs (SimPy).

    from fm_pipeline.sim import simulate_job, llama3_405b
    result = simulate_job(llama3_405b(seed=1))
    result.ettr, result.interruptions, result.lost_gpu_hours

The job alternates training (checkpoint every `interval_s`), blocking saves, and, after a
fault, detection -> node replacement -> relaunch + restore. Work since the last durable
checkpoint is lost. Stragglers slow the whole job to their pace until they end or are
excluded. Every GPU-second of the horizon lands in exactly one bucket: productive work,
lost work, detection, replacement, restart, checkpoint stalls or straggler slowdown.

Speed: the GPUs of one failure class are not 16,384 SimPy processes. With exponential
lifetimes and a repaired/swapped component taking its place, N identical components are
one Poisson process of rate N x lambda, and the superposition over classes is one Poisson
process picking the class in proportion to its rate. The only per-component state that
matters, nodes in repair refilling the hot-spare pool, is a counter plus one short
process per failed node. So the cost is O(checkpoints + failures + stragglers), not
O(GPUs).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import simpy

from fm_pipeline.sim.config import SimConfig
from fm_pipeline.sim.failures import FailureMode
from fm_pipeline.sim.results import SimResult

_EPS = 1e-9


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for the benchmark)."""

    events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()


class _PaceChanged:
    """Interrupt cause: a straggler started or ended; training continues at a new pace."""


_PACE_CHANGED = _PaceChanged()


@dataclass
class _Recovery:
    category: str
    detect_s: float
    planned: bool = False  # save first, lose nothing, no detection (maintenance, exclusion)
    save_first: bool = False
    in_job: bool = False  # survived by the fast tier: an in-job restart from memory


@dataclass
class _Straggler:
    factor: float
    excluded: bool = False


class _JobSim:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.env = CountingEnvironment()
        seeds = np.random.SeedSequence(cfg.seed).spawn(5)
        # Separate streams: changing the checkpoint policy or the straggler model keeps
        # the same failure arrivals (common random numbers make sweeps smooth).
        self.rng_fail, self.rng_repair, self.rng_strag, self.rng_strag_t, self.rng_fast = (
            np.random.default_rng(s) for s in seeds
        )
        self.n_gpus = cfg.n_gpus
        self.state = "train"
        self.state_category = "none"
        self.last_tick = 0.0
        self.work = 0.0  # seconds of full-speed training done (incl. not yet durable)
        self.durable = 0.0  # work covered by the newest durable checkpoint
        self.pending: tuple[float, float] | None = None  # (durable at, work) of a save
        self.next_ckpt = cfg.checkpoint.interval_s
        self.recovery: _Recovery | None = None
        self.nodes_needed = 0
        self.spares = cfg.recovery.hot_spares
        self.stragglers: dict[int, _Straggler] = {}
        self.lost: dict[tuple[str, str], float] = defaultdict(float)  # GPU-seconds
        self.interruptions: Counter = Counter()
        self.component_failures: Counter = Counter()
        self.counts: Counter = Counter()
        self.timeline: list[tuple[float, float]] = [(0.0, 0.0)]
        self.proc = self.env.process(self._job())
        self.env.process(self._failures())
        if cfg.stragglers.rate_per_node_day > 0:
            self.env.process(self._straggler_arrivals())

    # --- accounting --------------------------------------------------------------------

    @property
    def pace(self) -> float:
        slow = [s.factor for s in self.stragglers.values() if not s.excluded]
        return 1.0 / max(slow) if slow else 1.0

    def _tick(self) -> None:
        """Book the time since the last tick to the current state."""
        now = self.env.now
        dt = now - self.last_tick
        if dt > 0:
            gpu_s = dt * self.n_gpus
            if self.state == "train":
                pace = self.pace
                self.work += dt * pace
                if pace < 1.0:
                    self.lost[("stragglers", "straggler")] += gpu_s * (1.0 - pace)
            else:
                self.lost[(self.state, self.state_category)] += gpu_s
            self.last_tick = now
        self._commit_if_due()

    def _set_state(self, state: str, category: str = "none") -> None:
        self._tick()
        self.state, self.state_category = state, category
        self.timeline.append((self.env.now, self.work))

    def _commit_if_due(self) -> None:
        if self.pending is not None and self.pending[0] <= self.env.now + _EPS:
            self.durable = self.pending[1]
            self.pending = None

    # --- the job -------------------------------------------------------------------------

    def _job(self):
        while True:
            try:
                if self.recovery is not None:
                    yield from self._recover()
                yield from self._train_until_checkpoint()
                yield from self._save()
            except simpy.Interrupt as irq:
                self._on_interrupt(irq.cause)

    def _train_until_checkpoint(self):
        self._set_state("train")
        while self.next_ckpt - self.work > _EPS * max(1.0, self.next_ckpt):
            try:
                yield self.env.timeout((self.next_ckpt - self.work) / self.pace)
                self._tick()
                break
            except simpy.Interrupt as irq:
                if irq.cause is not _PACE_CHANGED:
                    raise
                self._tick()  # book the old pace up to now; loop at the new one
        # Reached the checkpoint; the float sum of paced slices may fall short by ulps.
        self.work = max(self.work, self.next_ckpt)

    def _save(self, *, durable: bool = False):
        """A checkpoint save; `durable`: wait until it is committed (before a restart)."""
        ck = self.cfg.checkpoint
        self._set_state("checkpoint", "checkpoint")
        if self.pending is not None:  # the previous async save is still persisting
            yield from self._wait(self.pending[0] - self.env.now)
            self._tick()
        yield from self._wait(ck.save_blocking_s)
        self._tick()
        if durable or ck.persist_s == 0:
            if durable and ck.persist_s > 0:
                yield from self._wait(ck.persist_s)
                self._tick()
            self.durable = self.work
        else:
            self.pending = (self.env.now + ck.persist_s, self.work)
        self.next_ckpt = self.work + ck.interval_s
        self.counts["checkpoints"] += 1

    def _wait(self, duration: float):
        """Wait `duration`; pace changes do not matter outside training, other causes do."""
        end = self.env.now + duration
        while True:
            try:
                yield self.env.timeout(max(end - self.env.now, 0.0))
                return
            except simpy.Interrupt as irq:
                if irq.cause is not _PACE_CHANGED:
                    raise

    def _recover(self):
        rec, rc = self.recovery, self.cfg.recovery
        if rec.save_first:
            yield from self._save(durable=True)
        if rec.detect_s > 0:
            self._set_state("detection", rec.category)
            yield from self._wait(rec.detect_s)
        if self.nodes_needed:
            self._set_state("replacement", rec.category)
            from_pool = min(self.spares, self.nodes_needed)
            self.spares -= from_pool
            cold = self.nodes_needed - from_pool
            self.counts["spare_swaps"] += from_pool
            self.counts["cold_replacements"] += cold
            yield from self._wait(rc.cold_replace_s if cold else rc.spare_swap_s)
            # Nodes that failed during the swap join it (no extra wait, counted as well).
            late = self.nodes_needed - from_pool - cold
            late_from_pool = min(self.spares, late)
            self.spares -= late_from_pool
            self.counts["spare_swaps"] += late_from_pool
            self.counts["cold_replacements"] += late - late_from_pool
            self.nodes_needed = 0
        self._set_state("restart", rec.category)
        fast = self.cfg.fast_tier
        yield from self._wait(fast.restart_s + fast.load_s if rec.in_job
                              else rc.restart_s + self.cfg.checkpoint.load_s)
        self.counts["in_job_restarts" if rec.in_job else "durable_restarts"] += 1
        for s in self.stragglers.values():
            if s.excluded is None:  # detected while the job was down: left out of the relaunch
                s.excluded = True
        self.recovery = None
        self.next_ckpt = self.work + self.cfg.checkpoint.interval_s
        self.counts["restarts"] += 1

    def _on_interrupt(self, cause) -> None:
        self._tick()
        if isinstance(cause, FailureMode):
            if cause.planned:
                self.recovery = _Recovery("maintenance", 0.0, planned=True, save_first=True)
                return
            in_job = self._fast_survives(cause)
            self._roll_back(cause.category, to_snapshot=in_job)
            self.recovery = _Recovery(cause.category, cause.detect_s, in_job=in_job)
        elif isinstance(cause, _Straggler):
            self.recovery = _Recovery("straggler", 0.0, planned=True, save_first=True)

    def _fast_survives(self, mode: FailureMode) -> bool:
        fast = self.cfg.fast_tier
        if fast.interval_s <= 0 or mode.unit == "job" or self.cfg.n_nodes < 2:
            return False
        if fast.survivable is None:
            return mode.fast_survivable
        return bool(self.rng_fast.random() < fast.survivable)

    def _roll_back(self, category: str, *, to_snapshot: bool = False) -> None:
        """Back to the newest durable checkpoint, or (`to_snapshot`) to the newer of it and
        the newest in-memory snapshot (taken every fast interval of work)."""
        self._commit_if_due()
        self.pending = None  # an async save still in flight is lost with the job
        back_to = self.durable
        if to_snapshot:
            step = self.cfg.fast_tier.interval_s
            back_to = max(back_to, math.floor(self.work / step + _EPS) * step)
        lost = self.work - back_to
        if lost > 0:
            self.lost[("lost_work", category)] += lost * self.n_gpus
        self.work = back_to

    # --- faults ----------------------------------------------------------------------------

    def _failures(self):
        cfg = self.cfg
        modes = list(cfg.failure_modes)
        rates = np.array(
            [m.rate_per_hour(n_gpus=cfg.n_gpus, gpus_per_node=cfg.gpus_per_node) for m in modes]
        ) / 3600.0
        total = rates.sum()
        if total <= 0:
            return
        probs = rates / total
        while True:
            yield self.env.timeout(self.rng_fail.exponential(1.0 / total))
            mode = modes[int(self.rng_fail.choice(len(modes), p=probs))]
            self._fault(mode)

    def _fault(self, mode: FailureMode) -> None:
        self.component_failures[mode.name] += 1
        if mode.replace_node:
            self.nodes_needed += 1
            self.env.process(self._repair())
        job_is_up = self.recovery is None or self.state == "restart"
        if self.state == "checkpoint" and self.recovery is not None:
            job_is_up = True  # a failure during the pre-restart save
        if not job_is_up:
            return  # the job is already down: the fault only adds a node to replace
        if mode.planned and self.recovery is not None:
            return
        self.interruptions[mode.name] += 1
        self.proc.interrupt(mode)

    def _repair(self):
        rc = self.cfg.recovery
        yield self.env.timeout(self.rng_repair.exponential(rc.repair_s) if rc.repair_s else 0.0)
        if self.spares < rc.hot_spares:
            self.spares += 1

    def _straggler_arrivals(self):
        sm = self.cfg.stragglers
        rate = sm.rate_per_node_day * self.cfg.n_nodes / 86400.0
        next_id = 0
        while True:
            yield self.env.timeout(self.rng_strag_t.exponential(1.0 / rate))
            excess = sm.excess_median * math.exp(sm.excess_sigma * self.rng_strag.standard_normal())
            duration = self.rng_strag_t.exponential(sm.duration_mean_s)
            self.env.process(self._straggler(next_id, 1.0 + min(excess, 9.0), duration))
            next_id += 1

    def _straggler(self, sid: int, factor: float, duration: float):
        sm = self.cfg.stragglers
        straggler = _Straggler(factor)
        self._pace_change(lambda: self.stragglers.__setitem__(sid, straggler))
        self.counts["stragglers"] += 1
        detected = sm.mitigation != "none" and sm.detect_s < duration
        if detected:
            yield self.env.timeout(sm.detect_s)
            self.counts["stragglers_detected"] += 1
            if sm.mitigation == "exclude" and not straggler.excluded:
                self.counts["stragglers_excluded"] += 1
                self.nodes_needed += 1
                self.env.process(self._repair())
                if self.recovery is None:
                    self._tick()  # book the slow pace up to now
                    straggler.excluded = True  # swapped out by the restart that follows
                    self.proc.interrupt(straggler)
                else:
                    straggler.excluded = None  # swapped out by the recovery under way
            yield self.env.timeout(duration - sm.detect_s)
        else:
            yield self.env.timeout(duration)
        self._pace_change(lambda: self.stragglers.pop(sid, None))

    def _pace_change(self, mutate) -> None:
        """Apply a change to the set of slow nodes, booking the old pace up to now."""
        self._tick()
        before = self.pace
        mutate()
        if self.state == "train" and self.pace != before and self.recovery is None:
            self.proc.interrupt(_PACE_CHANGED)

    # --- run -------------------------------------------------------------------------------

    def run(self) -> SimResult:
        self.env.run(until=self.cfg.horizon_s)
        self._tick()
        self.timeline.append((self.env.now, self.work))
        return SimResult.build(
            self.cfg,
            productive_gpu_s=self.work * self.n_gpus,
            lost_gpu_s=dict(self.lost),
            interruptions=dict(self.interruptions),
            component_failures=dict(self.component_failures),
            counts=dict(self.counts),
            timeline=self.timeline,
            events_simulated=self.env.events_processed,
        )


def simulate_job(cfg: SimConfig) -> SimResult:
    """Run one seeded simulation of `cfg`; deterministic for a given config and seed."""
    return _JobSim(cfg).run()
