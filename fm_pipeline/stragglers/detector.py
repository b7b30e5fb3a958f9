"""Straggler detection: which rank is persistently slow, in which section, and what it costs.

    from fm_pipeline.stragglers.detector import RankTiming, StragglerDetector
    detector = StragglerDetector(world_size=8)
    for gathered in timings_every_k_steps:            # list[RankTiming | dict], one gather
        for event in detector.update(gathered):       # newly raised events
            log(event.to_dict())
    detector.events                                   # all events, kept up to date

Pure python/numpy: it runs on rank 0 over timings the trainer already gathered, in the
orchestrator over the run's JSON lines, or in the simulator.

How a rank is scored. Each gathered step is one sample. Within a sample every rank is
compared with its peers (ranks of the same `peer_group`, e.g. the same pipeline stage)
section by section, leave-one-out: the excess over the peers' median, divided by a robust
noise scale, the largest of the peers' MAD (as a standard deviation), the group's
step-to-step jitter of that excess over the window (which works with two ranks, where a
MAD of one peer means nothing, and ignores noise that slows every rank alike, e.g. a
loaded host) and `noise_floor` x the step time. A section is *slow* in a sample when
this z-score passes `z_threshold` AND its excess adds at least `min_step_slowdown` to a
healthy step. A rank becomes a straggler when a section is slow in at least `persist` of
the last `window` samples (one-off spikes, e.g. GC pauses, never qualify), and recovers
when no more than `window - persist` remain slow.

Attribution. In synchronous training a slow rank's *compute* (or data wait) is high while
its peers' *collective wait* is high: they sit in the all-reduce waiting for it, and the
straggler itself waits least. So raw collective wait is a symptom, not a cause. The
collective section is scored on the part the late arrival does not explain,
collective_wait - (last peer's arrival - own arrival), i.e. the rank's own transfer time:
victims of a compute straggler do not stand out there; a rank whose own collective is
slow does.

Cost. While a rank is slow by `excess` seconds per step, each of the other ranks idles
that long in the collective: idle GPU-seconds = excess x (ranks - 1) x gpus_per_rank,
per step (a sample stands for the steps since the previous one).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

import numpy as np

SECTIONS = ("compute", "data_wait", "collective_wait")
_COMPUTE, _DATA, _COLLECTIVE = range(3)
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation


@dataclass(frozen=True)
class RankTiming:
    """One rank's timings for one step (seconds), as gathered by the trainer every K steps.

    `peer_group` separates ranks that are not comparable (e.g. pipeline stages do different
    work); ranks are only scored against ranks of the same group.
    """

    step: int
    rank: int
    host: str
    compute_s: float
    collective_wait_s: float
    data_wait_s: float
    peer_group: int = 0

    def __post_init__(self) -> None:
        for name in ("compute_s", "collective_wait_s", "data_wait_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"rank {self.rank} step {self.step}: {name} must be a finite number "
                    f">= 0 seconds, got {value!r}"
                )
        if self.step < 0 or self.rank < 0:
            raise ValueError(f"step and rank must be >= 0, got step {self.step} rank {self.rank}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RankTiming":
        """Build from a JSON-lines record; names the missing field if there is one."""
        missing = [k for k in ("step", "rank", "compute_s", "collective_wait_s") if k not in d]
        if missing:
            raise ValueError(f"rank timing record lacks {', '.join(missing)}: {dict(d)!r}")
        return cls(
            step=int(d["step"]),
            rank=int(d["rank"]),
            host=str(d.get("host", f"rank-{d['rank']}")),
            compute_s=float(d["compute_s"]),
            collective_wait_s=float(d["collective_wait_s"]),
            data_wait_s=float(d.get("data_wait_s", 0.0)),
            peer_group=int(d.get("peer_group", 0)),
        )

    def section(self, name: str) -> float:
        return getattr(self, f"{name}_s")


@dataclass
class StragglerEvent:
    """A persistently slow rank. Open while `recovered_step` is None; kept up to date."""

    rank: int
    host: str
    section: str  # compute | data_wait | collective_wait
    severity: float  # median excess over peers as a fraction of the step time (0.5 = +50%)
    section_ratio: float  # median of the section's time / the peers' median
    z: float  # median robust z-score over the slow samples
    first_step: int  # first slow sample of the streak that raised the event
    detected_step: int
    last_step: int  # last slow sample seen
    idle_gpu_hours: float  # time the other ranks' GPUs spent waiting for this one
    recovered_step: int | None = None

    @property
    def active(self) -> bool:
        return self.recovered_step is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StragglerDetector:
    """Feed it gathered per-rank timings; it raises and maintains straggler events.

    One detector per set of ranks (a segment): after a restart on other hosts or another
    world size, start a new one.
    """

    def __init__(
        self,
        *,
        world_size: int | None = None,
        window: int = 8,
        persist: int = 6,
        z_threshold: float = 3.0,
        min_step_slowdown: float = 0.05,
        noise_floor: float = 0.01,
        gpus_per_rank: int = 1,
    ) -> None:
        if window < 2 or not 1 <= persist <= window:
            raise ValueError(f"need window >= 2 and 1 <= persist <= window, got {window}/{persist}")
        if z_threshold <= 0 or min_step_slowdown < 0 or noise_floor <= 0:
            raise ValueError("z_threshold and noise_floor must be > 0, min_step_slowdown >= 0")
        if world_size is not None and world_size < 2:
            raise ValueError(f"straggler detection needs >= 2 ranks, got world_size {world_size}")
        if gpus_per_rank < 1:
            raise ValueError(f"gpus_per_rank must be >= 1, got {gpus_per_rank}")
        self.world_size = world_size
        self.window = window
        self.persist = persist
        self.z_threshold = z_threshold
        self.min_step_slowdown = min_step_slowdown
        self.noise_floor = noise_floor
        self.gpus_per_rank = gpus_per_rank
        self.events: list[StragglerEvent] = []
        self._ranks: list[int] | None = None  # column order of the ring buffers
        self._open: dict[tuple[int, int], StragglerEvent] = {}  # (column, section) -> event
        self._last_step: int | None = None
        self._n_samples = 0

    @property
    def active(self) -> list[StragglerEvent]:
        return [e for e in self.events if e.active]

    @property
    def idle_gpu_hours(self) -> float:
        return sum(e.idle_gpu_hours for e in self.events)

    def samples_to_detect(self) -> int:
        """Gathered samples a persistent straggler needs before it is raised (the bound)."""
        return self.persist

    def update(self, records: Iterable[RankTiming | Mapping[str, Any]]) -> list[StragglerEvent]:
        """Score one or more gathered steps; return the events raised by them (new only)."""
        by_step: dict[int, list[RankTiming]] = defaultdict(list)
        for r in records:
            timing = r if isinstance(r, RankTiming) else RankTiming.from_dict(r)
            by_step[timing.step].append(timing)
        raised: list[StragglerEvent] = []
        for step in sorted(by_step):
            if self._last_step is not None and step <= self._last_step:
                raise ValueError(
                    f"timings for step {step} arrived after step {self._last_step}; "
                    "feed gathered steps in increasing order"
                )
            steps_covered = 1 if self._last_step is None else step - self._last_step
            raised.extend(self._score_step(step, by_step[step], steps_covered))
            self._last_step = step
        return raised

    # --- one gathered step -------------------------------------------------------------

    def _columns(self, step: int, timings: list[RankTiming]) -> list[RankTiming]:
        ranks = sorted(t.rank for t in timings)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"step {step}: rank timings repeat a rank ({ranks})")
        if self._ranks is None:
            if self.world_size is not None and len(ranks) != self.world_size:
                raise ValueError(
                    f"step {step}: got timings from {len(ranks)} ranks, expected world_size "
                    f"{self.world_size}"
                )
            if len(ranks) < 2:
                raise ValueError(f"step {step}: straggler detection needs >= 2 ranks")
            self._ranks = ranks
            self._alloc(len(ranks))
        elif ranks != self._ranks:
            raise ValueError(
                f"step {step}: ranks {ranks} differ from the first gather's {self._ranks}; "
                "use a new StragglerDetector for a new set of ranks"
            )
        return sorted(timings, key=lambda t: t.rank)

    def _alloc(self, n: int) -> None:
        shape = (self.window, len(SECTIONS), n)
        self._values = np.full(shape, np.nan)
        self._slow = np.zeros(shape, dtype=bool)
        self._z = np.zeros(shape)
        self._frac = np.zeros(shape)
        self._ratio = np.zeros(shape)
        self._idle = np.zeros(shape)
        self._steps = np.full(self.window, -1, dtype=np.int64)

    def _score_step(
        self, step: int, timings: list[RankTiming], steps_covered: int
    ) -> list[StragglerEvent]:
        timings = self._columns(step, timings)
        n = len(timings)
        values = np.array(
            [[t.section(s) for t in timings] for s in SECTIONS], dtype=float
        )  # [section, rank]
        groups = np.array([t.peer_group for t in timings])
        values[_COLLECTIVE] = _unexplained_collective_wait(values, groups)
        slot = self._n_samples % self.window
        self._values[slot] = values
        self._steps[slot] = step
        filled = min(self._n_samples + 1, self.window)
        oldest = self._n_samples + 1 - filled
        history = self._values[[(oldest + i) % self.window for i in range(filled)]]  # in time order
        z = np.zeros_like(values)
        frac = np.zeros_like(values)
        ratio = np.ones_like(values)
        excess = np.zeros_like(values)
        for g in np.unique(groups):
            cols = np.flatnonzero(groups == g)
            if len(cols) < 2:
                continue
            sz, sf, sr, se = self._score_group(values[:, cols], history[:, :, cols])
            z[:, cols], frac[:, cols], ratio[:, cols], excess[:, cols] = sz, sf, sr, se
        slow = (z >= self.z_threshold) & (frac >= self.min_step_slowdown)
        idle = np.clip(excess, 0, None) * (n - 1) * self.gpus_per_rank * steps_covered
        self._slow[slot], self._z[slot], self._frac[slot] = slow, z, frac
        self._ratio[slot], self._idle[slot] = ratio, np.where(slow, idle, 0.0)
        self._n_samples += 1
        return self._advance(step, slow, timings)

    def _score_group(self, values: np.ndarray, history: np.ndarray):
        """Leave-one-out robust scores of each rank's sections against its peers'."""
        n = values.shape[1]
        peer_median = _leave_one_out_median(values)  # [section, rank]
        # A healthy step for rank r: its peers' median work (compute + data + transfer).
        peer_step = _leave_one_out_median(values.sum(axis=0, keepdims=True))[0]
        step_time = float(np.median(peer_step))
        # Spatial noise: the peers' spread (a single outlier barely moves a MAD of >= 3).
        if n >= 3:
            med = np.median(values, axis=1, keepdims=True)
            spatial = _MAD_TO_SIGMA * np.median(np.abs(values - med), axis=1)
        else:
            spatial = np.zeros(values.shape[0])
        # Temporal noise: step-to-step jitter of each rank's excess over its peers' median,
        # pooled over the group. A persistent offset does not enter it, so two ranks
        # suffice; noise that slows every rank alike (a loaded host, the network) cancels
        # in the excess, as it does in the score itself.
        samples, sections = history.shape[0], history.shape[1]
        peers = _leave_one_out_median(history.reshape(samples * sections, n))
        excess_history = history - peers.reshape(samples, sections, n)
        diffs = np.abs(np.diff(excess_history, axis=0))  # [samples-1, section, rank]
        pooled = diffs.transpose(1, 0, 2).reshape(values.shape[0], -1)
        temporal = np.zeros(values.shape[0])
        if pooled.shape[1] >= 2:
            temporal = _MAD_TO_SIGMA * np.median(pooled, axis=1) / math.sqrt(2)
        scale = np.maximum(np.maximum(spatial, temporal), self.noise_floor * step_time)
        scale = np.maximum(scale, 1e-9)[:, None]
        excess = values - peer_median
        z = excess / scale
        frac = excess / np.maximum(peer_step, 1e-9)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(peer_median > 0, values / peer_median, np.inf)
        return z, frac, ratio, excess

    # --- events --------------------------------------------------------------------------

    def _advance(self, step: int, slow: np.ndarray, timings: list[RankTiming]):
        counts = self._slow.sum(axis=0)  # [section, rank]
        raised = []
        for (s, c), event in list(self._open.items()):
            if slow[s, c]:
                event.last_step = step
                slot = (self._n_samples - 1) % self.window
                event.idle_gpu_hours += float(self._idle[slot, s, c]) / 3600
            self._summarize(event, s, c)
            if counts[s, c] <= self.window - self.persist:
                event.recovered_step = step
                del self._open[(s, c)]
        for s, c in zip(*np.nonzero(counts >= self.persist)):
            s, c = int(s), int(c)
            if (s, c) in self._open:
                continue
            order = self._window_order()
            slow_slots = [i for i in order if self._slow[i, s, c]]
            first = slow_slots[0]
            streak = order[order.index(first):]
            event = StragglerEvent(
                rank=timings[c].rank,
                host=timings[c].host,
                section=SECTIONS[s],
                severity=0.0,
                section_ratio=0.0,
                z=0.0,
                first_step=int(self._steps[first]),
                detected_step=step,
                last_step=step,
                idle_gpu_hours=float(sum(self._idle[i, s, c] for i in streak)) / 3600,
            )
            self._summarize(event, s, c)
            self._open[(s, c)] = event
            self.events.append(event)
            raised.append(event)
        return raised

    def _window_order(self) -> list[int]:
        """Ring-buffer slots, oldest first, of the samples currently in the window."""
        filled = min(self._n_samples, self.window)
        start = self._n_samples - filled
        return [(start + i) % self.window for i in range(filled)]

    def _summarize(self, event: StragglerEvent, s: int, c: int) -> None:
        mask = self._slow[:, s, c]
        if not mask.any():
            return
        event.severity = float(np.median(self._frac[mask, s, c]))
        event.section_ratio = float(np.median(self._ratio[mask, s, c]))
        event.z = float(np.median(self._z[mask, s, c]))


def _leave_one_out_median(values: np.ndarray) -> np.ndarray:
    """For each column, the median of the other columns (per row). values: [rows, n>=2]."""
    n = values.shape[1]
    order = np.argsort(values, axis=1)
    sorted_vals = np.take_along_axis(values, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n)[None, :].repeat(values.shape[0], 0), axis=1)
    m = n - 1  # values left once one is removed

    def kth_of_rest(k: int) -> np.ndarray:
        # The k-th smallest of the rest is the k-th of all, or the (k+1)-th if the removed
        # value sat at or below position k.
        idx = np.where(pos > k, k, k + 1)
        return np.take_along_axis(sorted_vals, idx, axis=1)

    if m % 2:
        return kth_of_rest(m // 2)
    return 0.5 * (kth_of_rest(m // 2 - 1) + kth_of_rest(m // 2))


def _unexplained_collective_wait(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Collective wait minus the time spent waiting for the last peer to arrive.

    A rank arrives at the collective after its compute and data wait; everyone then waits
    for the last arrival. That part of the wait is the late rank's fault and is already
    scored in its compute or data section; what is left is the rank's own transfer time.
    """
    arrival = values[_COMPUTE] + values[_DATA]
    out = values[_COLLECTIVE].copy()
    for g in np.unique(groups):
        cols = groups == g
        out[cols] -= arrival[cols].max() - arrival[cols]
    return np.clip(out, 0.0, None)
