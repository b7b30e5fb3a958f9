"""Synthetic per-rank step timings with the noise real clusters show, for the straggler
detector's tests and for measuring its detection delay.

    from fm_pipeline.sim.rank_timings import SlowRank, synthetic_timings
    for gathered in synthetic_timings(n_ranks=16, steps=500, slow=[SlowRank(rank=3)]):
        detector.update(gathered)

Each step is synchronous: every rank computes (lognormal jitter around a per-rank speed
that differs by up to ~2% between healthy GPUs), waits for its data (usually ~1 ms, with
rare hiccups), then enters the all-reduce, which ends when the last rank arrives plus the
transfer time. A rank's collective wait is therefore the time it waited for the slowest
rank plus the transfer: the straggler's is the smallest. One-off spikes (GC pauses,
allocator stalls, a noisy neighbour) hit random ranks at random steps, and a whole step is
sometimes slower for everybody (a shared cause, e.g. the network), which peers cancel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from fm_pipeline.stragglers.detector import RankTiming


@dataclass(frozen=True)
class SlowRank:
    """A rank slowed on purpose: `section` takes `factor` x longer (or `extra_s` more)."""

    rank: int
    section: str = "compute"  # compute | data_wait
    factor: float = 1.5
    extra_s: float = 0.0
    from_step: int = 0
    to_step: int | None = None

    def active(self, step: int) -> bool:
        return step >= self.from_step and (self.to_step is None or step < self.to_step)


def synthetic_timings(
    *,
    n_ranks: int,
    steps: int,
    every: int = 1,
    seed: int = 0,
    compute_s: float = 1.0,
    comm_s: float = 0.15,
    jitter_sigma: float = 0.04,
    rank_spread: float = 0.02,
    spike_prob: float = 0.01,
    spike_s: tuple[float, float] = (0.2, 2.0),
    data_hiccup_prob: float = 0.005,
    shared_slow_prob: float = 0.02,
    ranks_per_host: int = 8,
    slow: list[SlowRank] | tuple[SlowRank, ...] = (),
) -> Iterator[list[RankTiming]]:
    """Yield, every `every` steps, the gathered timings of all ranks for that step."""
    if n_ranks < 1 or steps < 1 or every < 1:
        raise ValueError(f"need n_ranks, steps, every >= 1, got {n_ranks}, {steps}, {every}")
    for s in slow:
        if s.section not in ("compute", "data_wait"):
            raise ValueError(f"SlowRank.section must be compute or data_wait, got {s.section!r}")
        if not 0 <= s.rank < n_ranks:
            raise ValueError(f"SlowRank.rank {s.rank} outside 0..{n_ranks - 1}")
    rng = np.random.default_rng(seed)
    speed = 1.0 + rng.uniform(-rank_spread, rank_spread, size=n_ranks)
    hosts = [f"node-{r // ranks_per_host:04d}" for r in range(n_ranks)]
    for step in range(0, steps, every):
        shared = 1.0 + (rng.uniform(0.1, 0.5) if rng.random() < shared_slow_prob else 0.0)
        compute = compute_s * shared * speed * rng.lognormal(0.0, jitter_sigma, size=n_ranks)
        spikes = rng.random(n_ranks) < spike_prob
        compute = compute + spikes * rng.uniform(*spike_s, size=n_ranks)
        data = rng.lognormal(np.log(1e-3), 0.5, size=n_ranks)
        hiccups = rng.random(n_ranks) < data_hiccup_prob
        data = data + hiccups * rng.uniform(0.1, 1.0, size=n_ranks)
        for s in slow:
            if s.active(step):
                target = compute if s.section == "compute" else data
                target[s.rank] = target[s.rank] * s.factor + s.extra_s
        arrive = compute + data
        transfer = comm_s * rng.lognormal(0.0, jitter_sigma)
        collective = arrive.max() - arrive + transfer
        yield [
            RankTiming(
                step=step,
                rank=r,
                host=hosts[r],
                compute_s=float(compute[r]),
                collective_wait_s=float(collective[r]),
                data_wait_s=float(data[r]),
            )
            for r in range(n_ranks)
        ]
