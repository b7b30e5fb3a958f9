"""How often a training job is interrupted, per component, as Llama 3 405B's pre-training
saw it: the one failure model the planner's checkpoint intervals and the cluster
simulation (fm_pipeline.sim.failures) share.

    from fm_pipeline.planner.failure_model import llama3_failures_per_day
    llama3_failures_per_day(n_gpus=16384, gpus_per_node=8)    # 7.76: 419 in 54 days

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


def llama3_failures_per_day(*, n_gpus: int, gpus_per_node: int) -> float:
    """Unplanned interruptions per day of a job of this size at Llama 3's rates."""
    return 24 * sum(rate_per_unit_hour(count, unit)
                    * units_of(unit, n_gpus=n_gpus, gpus_per_node=gpus_per_node)
                    for _, _, count, unit, _ in LLAMA3_TABLE5)
