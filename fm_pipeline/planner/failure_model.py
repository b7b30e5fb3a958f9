"""How often a training job is interrupted, per component, as Llama 3 405B's pre-training
saw it: the one failure model the planner's checkpoint intervals and the cluster
simulation (fm_pipeline.sim.failures) share.

    from fm_pipeline.planner.failure_model import llama3_failure_mix
    llama3_failure_mix(n_gpus=16384, gpus_per_node=8).per_day   # 7.76: 419 in 54 days

Source: Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4, Table 5: root causes of
the 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs (2,048 nodes of
8), plus 47 planned ones (automated maintenance, announced: no work lost). Each count is
divided by its exposure, units x 54 days, with the unit it scales by: per GPU (the GPU,
HBM, SRAM, ...), per node (NIC, PSU, SSD, CPU, host maintenance; the fabric's switches and
cables grow with the node count too) or per job (software bugs do not multiply with the
GPU count). So the same rates scale to any job size: at 1,024 GPUs a job sees ~1.5
interruptions a day, more than a sixteenth of 7.76 because software bugs stay at one a day.
"""

from __future__ import annotations

from dataclasses import dataclass

# (component, category in the paper, count of 419, unit we scale it by, needs a node swap)
LLAMA3_TABLE5: tuple[tuple[str, str, int, str, bool], ...] = (
    ("faulty_gpu", "gpu", 148, "gpu", True),
    ("gpu_hbm3_memory", "gpu", 72, "gpu", True),
    ("software_bug", "software", 54, "job", False),
    ("network_switch_cable", "network", 35, "node", False),
    ("host_maintenance", "maintenance", 32, "node", True),  # "unplanned maintenance"
    ("gpu_sram_memory", "gpu", 19, "gpu", True),
    ("gpu_system_processor", "gpu", 17, "gpu", True),
    ("nic", "host", 7, "node", True),
    ("nccl_watchdog_timeout", "unknown", 7, "node", False),
    ("silent_data_corruption", "gpu", 6, "gpu", True),
    ("gpu_thermal_interface_sensor", "gpu", 6, "gpu", True),
    ("ssd", "host", 3, "node", True),
    ("power_supply", "host", 3, "node", True),
    ("server_chassis", "host", 2, "node", True),
    ("io_expansion_board", "host", 2, "node", True),
    ("dependency", "software", 2, "job", False),
    ("cpu", "host", 2, "node", True),
    ("system_memory", "host", 2, "node", True),
)
LLAMA3_PLANNED = 47
LLAMA3_GPUS = 16_384
LLAMA3_GPUS_PER_NODE = 8
LLAMA3_DAYS = 54


def llama3_units(unit: str) -> int:
    """How many of `unit` the Llama 3 run exposed."""
    return {"gpu": LLAMA3_GPUS, "node": LLAMA3_GPUS // LLAMA3_GPUS_PER_NODE, "job": 1}[unit]


def rate_per_unit_hour(count: int, unit: str) -> float:
    return count / (llama3_units(unit) * LLAMA3_DAYS * 24)


def units_of(unit: str, *, n_gpus: int, gpus_per_node: int) -> int:
    if unit == "gpu":
        return n_gpus
    if unit == "node":
        return -(-n_gpus // gpus_per_node)
    return 1


# How long until each kind of fault is noticed. A crash (Xid error, ECC, process exit) is
# seen by the elastic agent within about a minute; a hang only when the collective
# watchdog fires (torch's NCCL default is 10 minutes; large runs lower it). Assumptions:
# the paper gives no detection times.
CRASH_DETECT_S = 60.0
HANG_DETECT_S = 600.0
HANGS = frozenset({"network_switch_cable", "nccl_watchdog_timeout", "silent_data_corruption"})

# What the fast tier (in-memory snapshots, a replica on the ring peer, an in-job restart:
# docs/checkpoints.md) survives, by what a fault leaves behind. Each kind is a fault the
# tests inject into a real run (fm_pipeline.resilience.scenarios.fast, 2 nodes x 2 ranks):
#   workers die or a collective breaks, every node's memory stays (no node swap): restart
#     in place from each node's own snapshot (its first fault, SIGKILL of rank 3);
#   one node lost (its GPU, NIC, PSU, ...; swapped for a spare): its ranks restore from the
#     peer's replicas (its second fault);
# and what takes the durable tier (its third fault: no copy in memory every rank can load),
# for the components below. Which kind each of Llama 3's components is, is our reading of
# Table 5: an assumption, stated wherever the share is shown.
NOT_FAST_SURVIVABLE = {
    "software_bug": "the job's own failure: a fix and a new launch, not a restart in place",
    "dependency": "a service the job needs is down: a new launch once it is back",
    "silent_data_corruption": "the newest snapshots may carry the corruption: roll back "
                              "to a durable checkpoint",
}


@dataclass(frozen=True)
class FailureMix:
    """What a job of one size sees, per day and per failure, at Llama 3's rates."""

    per_day: float  # unplanned interruptions
    planned_per_day: float  # announced (automated maintenance): a save, then a restart
    fast_share: float  # of the unplanned ones, those the fast tier survives
    detect_s: tuple[float, float]  # mean detection: (fast-survivable, the others)
    swap_share: tuple[float, float]  # share that waits for a node swap: (fast, others)


def llama3_failure_mix(*, n_gpus: int, gpus_per_node: int) -> FailureMix:
    groups = {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}  # rate, rate x detect, swaps
    for name, _, count, unit, swap in LLAMA3_TABLE5:
        rate = 24 * rate_per_unit_hour(count, unit) * units_of(
            unit, n_gpus=n_gpus, gpus_per_node=gpus_per_node)
        g = groups[name not in NOT_FAST_SURVIVABLE]
        g[0] += rate
        g[1] += rate * (HANG_DETECT_S if name in HANGS else CRASH_DETECT_S)
        g[2] += rate * swap
    total = groups[True][0] + groups[False][0]

    def mean(i: int) -> tuple[float, float]:
        return tuple(g[i] / g[0] if g[0] else 0.0 for g in (groups[True], groups[False]))

    return FailureMix(per_day=total, planned_per_day=LLAMA3_PLANNED / LLAMA3_DAYS,
                      fast_share=groups[True][0] / total, detect_s=mean(1), swap_share=mean(2))


def node_failure_mix(per_day: float, *, n_gpus: int, gpus_per_node: int) -> FailureMix:
    """A flat rate (a cluster's own incident data): how many, `per_day`; of what kinds
    (survived by the fast tier, noticed as a crash or a hang, swapping a node), as Llama 3's
    at this job size: an assumption, the rate alone does not say. No planned ones."""
    mix = llama3_failure_mix(n_gpus=n_gpus, gpus_per_node=gpus_per_node)
    return FailureMix(per_day=per_day, planned_per_day=0.0, fast_share=mix.fast_share,
                      detect_s=mix.detect_s, swap_share=mix.swap_share)
