"""What the trainer measures: peak FLOP/s of the device, MFU, the host's name. The files it
writes them to (metrics.jsonl, rank_timings.jsonl, segments.jsonl) are
fm_pipeline.rundir.records, which documents every field.
"""

from __future__ import annotations

import os
import socket

import torch

from fm_pipeline.accelerators import cuda_accelerator_name, get_accelerator, measured_cpu
from fm_pipeline.config import compute_dtype
from fm_pipeline.cpu_peaks import cpu_peak


def peak_flops_per_device(device: torch.device, mixed_precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device for the compute dtype, the accelerator's name).

    GPUs: the catalog's dense datasheet figure (BF16, or TF32 for fp32 runs); unknown GPUs
    give None (no MFU rather than a wrong one). CPU: a matmul probe in the dtype the model
    computes in, with the thread count of this process, run once per host."""
    dtype = compute_dtype(mixed_precision)  # FP8 runs: MFU against the bf16 peak
    if device.type == "cuda":
        name = cuda_accelerator_name(torch.cuda.get_device_name(device))
        if name is None:
            return None, torch.cuda.get_device_name(device)
        return get_accelerator(name).peak_flops(dtype), name
    threads = torch.get_num_threads()
    if dtype == "fp32":  # the probe of one dtype is enough
        return cpu_peak("fp32", threads=threads), f"cpu-{threads}t"
    cpu = measured_cpu()
    return cpu.peak_flops(dtype), cpu.name


def mfu(*, flops_per_token: int, tokens: int, step_time_s: float, devices: int,
        peak_flops: float | None) -> float | None:
    if not peak_flops or step_time_s <= 0:
        return None
    return flops_per_token * tokens / (step_time_s * devices * peak_flops)


def host_name() -> str:
    return os.environ.get("HOSTNAME") or socket.gethostname()


