"""What a simulated training job looks like: size, failures, checkpoints, recovery, stragglers.

    from fm_pipeline.sim.config import SimConfig, llama3_405b
    cfg = llama3_405b()                                    # the calibrated Llama 3 run
    cfg = cfg.with_(checkpoint=cfg.checkpoint.with_(interval_s=1200), seed=2)

All durations are seconds of wall-clock time. Every knob has a default that says where it
comes from (a paper, or an assumption named as one in docs/simulation.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from fm_pipeline.planner.failure_model import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_GPUS_PER_NODE
from fm_pipeline.sim.failures import FailureMode, llama3_failure_modes


class _With:
    def with_(self, **changes):
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


def _check_non_negative(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class CheckpointPolicy(_With):
    """Save every `interval_s` of training. The loop stalls `save_blocking_s` per save (the
    whole write for a synchronous save, only the device-to-host staging for an async one);
    an async save becomes durable `persist_s` later, and a failure before that loses it."""

    interval_s: float = 1800.0
    save_blocking_s: float = 10.0
    persist_s: float = 60.0
    load_s: float = 120.0

    def __post_init__(self) -> None:
        _check_non_negative(self, "save_blocking_s", "persist_s", "load_s")
        if not math.isfinite(self.interval_s) or self.interval_s <= 0:
            raise ValueError(f"CheckpointPolicy.interval_s must be > 0, got {self.interval_s!r}")

    @classmethod
    def sync(cls, *, interval_s: float, write_s: float, load_s: float = 120.0):
        """A synchronous save: the loop waits for the whole write, durable when it returns."""
        return cls(interval_s=interval_s, save_blocking_s=write_s, persist_s=0.0, load_s=load_s)


@dataclass(frozen=True)
class FastTierPolicy(_With):
    """In-memory snapshots with a peer replica (docs/checkpoints.md, "Fast tier"): every
    `interval_s` of training (0: off). An unplanned failure of one GPU or one node whose
    mode is `fast_survivable` (what it leaves behind is one node's memory at most: the
    fault kinds the fast-tier scenario survives, planner.failure_model) costs an in-job
    restart of `restart_s` plus `load_s` from memory, rolled back to the newest snapshot;
    others, and job-wide ones, take the durable path. `survivable`, when given, replaces the
    modes' own verdicts by a probability (a what-if: correlated failures, your incident
    data). A lost node still waits for its replacement. `restart_s` 60 s is an assumption
    for a large job's re-rendezvous: benchmarks.recovery measures 0.6-7 s for one 2-core
    node and ~26 s for a lost node replaced by a spare, not a thousand nodes.
    Snapshots are taken as non-blocking (a device-to-host copy of milliseconds per shard
    against intervals of tens of seconds: docs/planner.md, "Two levels")."""

    interval_s: float = 0.0
    restart_s: float = 60.0
    load_s: float = 1.0
    survivable: float | None = None

    def __post_init__(self) -> None:
        _check_non_negative(self, "interval_s", "restart_s", "load_s")
        if self.survivable is not None and not 0 <= self.survivable <= 1:
            raise ValueError(f"FastTierPolicy.survivable must be within [0, 1], got "
                             f"{self.survivable!r}")


@dataclass(frozen=True)
class RecoveryPolicy(_With):
    """After a fault is detected: swap failed nodes (hot spare or cold), relaunch, restore.

    `restart_s`: relaunch to first step, without the checkpoint load (scheduling, container
    start, rendezvous, NCCL init, warm-up). Failed nodes go to repair for `repair_s` (mean,
    exponential) and then refill the hot-spare pool, which holds `hot_spares` nodes."""

    restart_s: float = 600.0
    hot_spares: int = 0
    spare_swap_s: float = 60.0
    cold_replace_s: float = 1800.0
    repair_s: float = 3 * 86400.0

    def __post_init__(self) -> None:
        _check_non_negative(self, "restart_s", "spare_swap_s", "cold_replace_s", "repair_s")
        if not isinstance(self.hot_spares, int) or self.hot_spares < 0:
            raise ValueError(f"RecoveryPolicy.hot_spares must be an int >= 0, got {self.hot_spares!r}")


@dataclass(frozen=True)
class StragglerModel(_With):
    """Fail-slow nodes: while one is slow, the synchronous job runs at its pace.

    Slowdown factor = 1 + lognormal(median `excess_median`, `excess_sigma`). Left alone a
    straggler lasts `duration_mean_s` (exponential; Alibaba's Falcon study saw tens of
    seconds to ~10 hours). `mitigation`: "none" (nobody looks), "report" (detected after
    `detect_s` and reported only), "exclude" (detected, then a checkpoint, the node swapped
    out and a restart)."""

    rate_per_node_day: float = 0.0
    excess_median: float = 0.25
    excess_sigma: float = 0.8
    duration_mean_s: float = 2 * 3600.0
    detect_s: float = 300.0
    mitigation: Literal["none", "report", "exclude"] = "report"

    @classmethod
    def from_detector(cls, detector, *, step_time_s: float, gather_every_steps: int, **kw):
        """Detection delay of the trainer's StragglerDetector: it needs `persist` slow samples,
        one every `gather_every_steps` steps (plus up to one gather until the first)."""
        if step_time_s <= 0 or gather_every_steps < 1:
            raise ValueError("step_time_s must be > 0 and gather_every_steps >= 1")
        delay = (detector.samples_to_detect() + 0.5) * gather_every_steps * step_time_s
        return cls(detect_s=delay, **kw)

    def __post_init__(self) -> None:
        _check_non_negative(self, "rate_per_node_day", "excess_sigma", "detect_s")
        if self.excess_median <= 0 or self.duration_mean_s <= 0:
            raise ValueError("StragglerModel.excess_median and duration_mean_s must be > 0")
        if self.mitigation not in ("none", "report", "exclude"):
            raise ValueError(
                f"StragglerModel.mitigation must be none, report or exclude, got {self.mitigation!r}"
            )


@dataclass(frozen=True)
class SimConfig(_With):
    """One synchronous training job on `n_gpus` GPUs for `horizon_days` of wall clock."""

    n_gpus: int = 16_384
    gpus_per_node: int = 8
    horizon_days: float = 54.0
    failure_modes: tuple[FailureMode, ...] = field(default_factory=lambda: tuple(llama3_failure_modes()))
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    recovery: RecoveryPolicy = RecoveryPolicy()
    stragglers: StragglerModel = StragglerModel()
    fast_tier: FastTierPolicy = FastTierPolicy()
    seed: int = 0
    name: str = "job"

    def __post_init__(self) -> None:
        if not isinstance(self.n_gpus, int) or self.n_gpus < 1:
            raise ValueError(f"SimConfig.n_gpus must be an int >= 1, got {self.n_gpus!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"SimConfig.gpus_per_node must be an int >= 1, got {self.gpus_per_node!r}")
        if not math.isfinite(self.horizon_days) or self.horizon_days <= 0:
            raise ValueError(f"SimConfig.horizon_days must be > 0, got {self.horizon_days!r}")
        object.__setattr__(self, "failure_modes", tuple(self.failure_modes))
        names = [m.name for m in self.failure_modes]
        if len(set(names)) != len(names):
            raise ValueError(f"failure mode names must be unique, got {names}")

    @property
    def n_nodes(self) -> int:
        return -(-self.n_gpus // self.gpus_per_node)

    @property
    def horizon_s(self) -> float:
        return self.horizon_days * 86400.0

    def failure_rate_per_hour(self, *, unplanned_only: bool = True) -> float:
        return sum(
            m.rate_per_hour(n_gpus=self.n_gpus, gpus_per_node=self.gpus_per_node)
            for m in self.failure_modes
            if not (unplanned_only and m.planned)
        )

    def mtbf_s(self) -> float:
        """Mean time between unplanned interruptions of the whole job."""
        rate = self.failure_rate_per_hour()
        return math.inf if rate == 0 else 3600.0 / rate

    def summary(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "failure_modes"}
        out["checkpoint"] = vars(self.checkpoint)
        out["recovery"] = vars(self.recovery)
        out["stragglers"] = vars(self.stragglers)
        out["fast_tier"] = vars(self.fast_tier)
        out["failure_modes"] = len(self.failure_modes)
        out["mtbf_hours"] = self.mtbf_s() / 3600
        return out


def llama3_405b(**changes) -> SimConfig:
    """Llama 3 405B pre-training as published: 16,384 H100s, 54 days, Table 5's failures.

    Recovery and checkpoint costs were not published; these defaults are the assumptions
    docs/calibration-simulation.md explains (async saves every 10 min, a 4 min relaunch plus 1 min restore)."""
    base = SimConfig(
        n_gpus=LLAMA3_GPUS,
        gpus_per_node=LLAMA3_GPUS_PER_NODE,
        horizon_days=float(LLAMA3_DAYS),
        failure_modes=tuple(llama3_failure_modes()),
        checkpoint=CheckpointPolicy(interval_s=600.0, save_blocking_s=10.0, persist_s=60.0,
                                    load_s=60.0),
        recovery=RecoveryPolicy(restart_s=240.0, hot_spares=16, spare_swap_s=60.0,
                                cold_replace_s=1800.0),
        name="llama3-405b",
    )
    return base.with_(**changes)
