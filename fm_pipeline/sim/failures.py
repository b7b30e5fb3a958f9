"""Failure modes of a training cluster and their published rates.

    from fm_pipeline.sim.failures import llama3_failure_modes
    modes = llama3_failure_modes()            # 18 root causes of Llama 3 405B's interruptions
    sum(m.expected_count(n_gpus=16384, gpus_per_node=8, hours=54 * 24) for m in modes)  # 419

A mode's rate is per *unit* and hour: per GPU (HBM, SRAM, the GPU itself), per node (NIC,
PSU, SSD, CPU, host maintenance; the fabric's switches and cables grow with the node
count too), or per job (software bugs do not multiply with the GPU count). So the same
modes scale to any job size.

Source of the default rates: Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4,
Table 5: root causes of the 419 unexpected interruptions of Llama 3 405B pre-training in
a 54-day snapshot on 16,384 H100 GPUs (2,048 nodes of 8), plus 47 planned interruptions
(automated maintenance). The counts are divided by the exposure (units x 54 days).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The rates are the planner's (one failure model for both: fm_pipeline/planner/failure_model.py).
from fm_pipeline.planner.failure_model import (
    CRASH_DETECT_S,
    HANG_DETECT_S,
    HANGS,
    LLAMA3_DAYS,
    LLAMA3_PLANNED,
    LLAMA3_TABLE5,
    NOT_FAST_SURVIVABLE,
    rate_per_unit_hour,
)


UNITS = ("gpu", "node", "job")
CATEGORIES = ("gpu", "host", "network", "software", "unknown", "maintenance")


@dataclass(frozen=True)
class FailureMode:
    """One root cause: how often it strikes, how long until it is noticed, what it breaks.

    `replace_node`: the node is taken out for repair and a spare (or a cold replacement)
    must join before the job restarts. `planned`: announced in advance, so the job saves a
    checkpoint first and loses no work (e.g. a scheduled firmware roll-out).
    `fast_survivable`: the fast tier's in-job restart recovers from it (what it leaves
    behind is one node's memory at most: planner.failure_model.NOT_FAST_SURVIVABLE).
    """

    name: str
    category: str
    unit: str  # gpu | node | job
    rate_per_unit_hour: float
    detect_s: float = 60.0
    replace_node: bool = True
    planned: bool = False
    fast_survivable: bool = True

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"failure mode {self.name!r}: unit must be one of {UNITS}")
        if self.category not in CATEGORIES:
            raise ValueError(f"failure mode {self.name!r}: category must be one of {CATEGORIES}")
        if self.rate_per_unit_hour < 0 or self.detect_s < 0:
            raise ValueError(f"failure mode {self.name!r}: rate and detect_s must be >= 0")

    def units(self, *, n_gpus: int, gpus_per_node: int) -> int:
        if self.unit == "gpu":
            return n_gpus
        if self.unit == "node":
            return -(-n_gpus // gpus_per_node)
        return 1

    def rate_per_hour(self, *, n_gpus: int, gpus_per_node: int) -> float:
        """Arrivals per hour for a job of this size (a superposition of its units)."""
        return self.rate_per_unit_hour * self.units(n_gpus=n_gpus, gpus_per_node=gpus_per_node)

    def expected_count(self, *, n_gpus: int, gpus_per_node: int, hours: float) -> float:
        return self.rate_per_hour(n_gpus=n_gpus, gpus_per_node=gpus_per_node) * hours

    def scaled(self, factor: float) -> "FailureMode":
        return replace(self, rate_per_unit_hour=self.rate_per_unit_hour * factor)


def llama3_failure_modes(*, hang_detect_s: float = HANG_DETECT_S,
                         crash_detect_s: float = CRASH_DETECT_S,
                         include_planned: bool = True) -> list[FailureMode]:
    """The 18 root causes of Table 5 (and the planned interruptions) as per-unit rates."""
    hours = LLAMA3_DAYS * 24
    modes = [
        FailureMode(
            name=name,
            category=category,
            unit=unit,
            rate_per_unit_hour=rate_per_unit_hour(count, unit),
            detect_s=hang_detect_s if name in HANGS else crash_detect_s,
            replace_node=swap,
            fast_survivable=name not in NOT_FAST_SURVIVABLE,
        )
        for name, category, count, unit, swap in LLAMA3_TABLE5
    ]
    if include_planned:
        modes.append(
            FailureMode(
                name="planned_maintenance",
                category="maintenance",
                unit="job",
                rate_per_unit_hour=LLAMA3_PLANNED / hours,
                detect_s=0.0,
                replace_node=False,
                planned=True,
            )
        )
    return modes


def single_mode(rate_per_gpu_hour: float, *, detect_s: float = CRASH_DETECT_S,
                replace_node: bool = True) -> list[FailureMode]:
    """One GPU failure mode at a given rate: for what-if sweeps and tests."""
    return [FailureMode("gpu_failure", "gpu", "gpu", rate_per_gpu_hour, detect_s, replace_node)]


def total_rate_per_hour(modes: list[FailureMode], *, n_gpus: int, gpus_per_node: int,
                        unplanned_only: bool = False) -> float:
    return sum(
        m.rate_per_hour(n_gpus=n_gpus, gpus_per_node=gpus_per_node)
        for m in modes
        if not (unplanned_only and m.planned)
    )
