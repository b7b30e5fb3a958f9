"""What the local launcher can run: this machine's cores, memory and GPUs, against a job.

    from fm_pipeline.launch.capacity import LocalCapacity, local_fit_problems
    problems = local_fit_problems(job, LocalCapacity.of_this_machine())
    # [("gpus", "2048 ranks of h100 need 2048 GPUs; this machine has 0 ...")]

The local launcher starts every rank of a segment as a process on this machine
(`torchrun --standalone`, nnodes x nproc_per_node workers). A job that cannot run here is
refused before any process starts, naming the numbers: the control plane at submission
(a pool that feeds the local launcher) and the launcher itself before torchrun.
Torch-free: the control side uses it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.model.flops import count_params

# CPU ranks per core: the suite runs 4 gloo ranks on 2 cores at about half the speed per
# step; past a few per core a step is mostly waiting on the OS scheduler.
RANKS_PER_CORE = 4
# A torch worker process before any model state (torch 2.13 imported with the model code: 0.52 GiB RSS measured).
RANK_BASE_GIB = 0.5
# fp32 weights, gradients and AdamW's two moments: what every parameter costs in training.
STATE_BYTES_PER_PARAM = 16
_GPU_DEVICE = re.compile(r"nvidia\d+")


@dataclass(frozen=True)
class LocalCapacity:
    cores: int
    memory_gib: float
    gpus: int

    @classmethod
    def of_this_machine(cls) -> "LocalCapacity":
        return cls(cores=len(os.sched_getaffinity(0)), memory_gib=_memory_gib(),
                   gpus=_visible_gpus())

    def describe(self) -> str:
        return (f"{self.cores} CPU cores, {self.memory_gib:.1f} GiB memory, "
                f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}")


def local_fit_problems(job, capacity: LocalCapacity) -> list[tuple[str, str]]:
    """(field, message) for each way `job` (a JobSpec) cannot run on `capacity` with the
    local launcher; [] when it fits. Fields are the job spec's."""
    p = job.parallelism
    ranks = p.world_size
    accelerator = job.cluster.accelerator
    layout = f"nnodes {p.nnodes} x nproc_per_node {p.nproc_per_node}"
    here = f"this machine has {capacity.describe()}; the local launcher runs every rank here"
    if accelerator.lower() != "cpu":
        if ranks > capacity.gpus:
            return [("parallelism", f"{ranks} ranks of {accelerator} ({layout}) need {ranks} "
                                    f"GPUs: {here}")]
        return []
    problems = []
    most = capacity.cores * RANKS_PER_CORE
    if ranks > most:
        problems.append(("parallelism", (
            f"{ranks} CPU ranks ({layout}) are more than {most} ({RANKS_PER_CORE} per core): "
            f"{here}")))
    need = lower_bound_memory_gib(job)
    if need > capacity.memory_gib:
        problems.append(("model", (
            f"{job.model.size} on {ranks} ranks needs at least {need:.1f} GiB (estimate: "
            f"{RANK_BASE_GIB} GiB per rank process + {STATE_BYTES_PER_PARAM} bytes per "
            f"parameter per replica, activations not counted): {here}")))
    return problems


def lower_bound_memory_gib(job) -> float:
    """Host memory a CPU job needs at least: each rank's process, plus weights, gradients
    and optimizer moments once per data-parallel replica (sharded over the rest)."""
    params = count_params(job.model_cfg).total
    replicas = job.parallelism.dp_replicate
    states = params * STATE_BYTES_PER_PARAM * replicas
    return job.parallelism.world_size * RANK_BASE_GIB + states / 2**30


def _memory_gib() -> float:
    """MemTotal, capped by this process's cgroup limit (a container's share)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in (Path("/sys/fs/cgroup/memory.max"),
                  Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total / 2**30


def _visible_gpus() -> int:
    """NVIDIA devices this process may use: CUDA_VISIBLE_DEVICES when set, else /dev/nvidiaN."""
    try:
        present = sum(1 for d in os.listdir("/dev") if _GPU_DEVICE.fullmatch(d))
    except OSError:
        present = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(len(ids), present)
