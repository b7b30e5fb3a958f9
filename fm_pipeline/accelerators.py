"""Accelerator catalog: peak dense FLOP/s, memory and links, shared by the trainer's MFU
and the planner. On CPU the peak is not a datasheet number: it is measured by a matmul
probe on this machine, with the thread count the workers use.

Datasheet figures are dense (no 2:4 sparsity) tensor-core peaks; FP8 (E4M3/E5M2) is twice
BF16 on Hopper and Blackwell and absent on Ampere and CPUs. `matmul_efficiency` is the
best bf16 matmul rate actually reached, over that peak ("maximum achievable matmul FLOPS":
stas00/ml-engineering, compute/accelerator/README.md; for the H100 SXM also 798 TFLOP/s
measured with a 8192^3 bf16 torch.matmul on one H100 SXM). The planner uses it as the
ceiling of every GEMM; the CPU's peak is itself a measured matmul, so its ceiling is 1.

The CPU probe runs once per host and thread count (fm_pipeline.cpu_peaks keeps the
figures), with torch's matmul where torch is installed (the trainer always has it); a
control-side process without torch measures numpy's fp32 matmul instead (bf16 taken as the
fp32 figure, the threads as numpy's own).
"""

from __future__ import annotations

from dataclasses import dataclass

TFLOPS = 1e12
CPU_DOLLARS_PER_HOUR = 0.1  # a cloud vCPU pair, order of magnitude: CPU runs are demos and tests


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_bf16_flops: float  # dense, per device
    peak_fp32_flops: float  # TF32 tensor cores on GPUs; plain FP32 SIMD on CPU
    memory_gib: float
    memory_bw_gbps: float  # HBM (or DRAM) GB/s
    intra_node_gbps: float  # per-device NVLink (unidirectional) GB/s
    inter_node_gbps: float  # per-device scale-out NIC GB/s (e.g. 400 Gb/s = 50 GB/s)
    dollars_per_hour: float  # indicative on-demand list price per device
    matmul_efficiency: float = 0.8  # best achieved dense matmul rate / peak
    sm_count: int = 1  # streaming multiprocessors: one GEMM tile per SM per wave
    peak_fp8_flops: float = 0.0  # dense FP8 tensor cores (0: none, e.g. A100 and CPUs)

    def peak_flops(self, dtype: str) -> float:
        if dtype in ("bf16", "bfloat16", "fp16"):
            return self.peak_bf16_flops
        if dtype in ("fp32", "float32", "tf32"):
            return self.peak_fp32_flops
        if dtype == "fp8" and self.peak_fp8_flops:
            return self.peak_fp8_flops
        raise ValueError(f"unknown dtype {dtype!r} for peak FLOP/s on {self.name}; use "
                         f"bf16, fp32{', fp8' if self.peak_fp8_flops else ''}")


CATALOG: dict[str, Accelerator] = {
    "a100-40gb": Accelerator("a100-40gb", 312 * TFLOPS, 156 * TFLOPS, 40, 1555, 300, 25, 1.8,
                             matmul_efficiency=0.859, sm_count=108),
    "a100-80gb": Accelerator("a100-80gb", 312 * TFLOPS, 156 * TFLOPS, 80, 2039, 300, 25, 2.2,
                             matmul_efficiency=0.859, sm_count=108),
    "h100-sxm": Accelerator("h100-sxm", 989 * TFLOPS, 494 * TFLOPS, 80, 3350, 450, 50, 3.0,
                            matmul_efficiency=0.803, sm_count=132,
                            peak_fp8_flops=1979 * TFLOPS),
    # Meta's Grand Teton H100 (96 GB HBM2e, 2.4 TB/s), where torchtitan publishes its H100
    # benchmarks; datasheet SXM peaks, though those hosts cap the GPUs at 500 W.
    "h100-96gb": Accelerator("h100-96gb", 989 * TFLOPS, 494 * TFLOPS, 96, 2400, 450, 50, 3.0,
                             matmul_efficiency=0.803, sm_count=132,
                             peak_fp8_flops=1979 * TFLOPS),
    # H800: the H100 SXM with NVLink cut to 400 GB/s both ways (DeepSeek-V3's cluster; its
    # report measures 160 GB/s, the 200 per direction at the planner's link efficiency).
    "h800": Accelerator("h800", 989 * TFLOPS, 494 * TFLOPS, 80, 3350, 200, 50, 2.0,
                        matmul_efficiency=0.803, sm_count=132, peak_fp8_flops=1979 * TFLOPS),
    "h200": Accelerator("h200", 989 * TFLOPS, 494 * TFLOPS, 141, 4800, 450, 50, 3.8,
                        matmul_efficiency=0.803, sm_count=132, peak_fp8_flops=1979 * TFLOPS),
    "b200": Accelerator("b200", 2250 * TFLOPS, 1100 * TFLOPS, 180, 8000, 900, 50, 6.0,
                        matmul_efficiency=0.776, sm_count=148, peak_fp8_flops=4500 * TFLOPS),
}

_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "h200-sxm": "h200"}


def get_accelerator(name: str) -> Accelerator:
    key = _ALIASES.get(name.lower(), name.lower())
    if key == "cpu":
        return measured_cpu()
    if key not in CATALOG:
        raise ValueError(
            f"unknown accelerator {name!r}; known: {', '.join([*CATALOG, 'cpu'])}"
        )
    return CATALOG[key]


def catalog_price(name: str) -> float | None:
    """The catalog's $/device-hour for `name` without measuring anything (the CPU entry's
    price is a constant), or None for a name the catalog does not know."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key == "cpu":
        return CPU_DOLLARS_PER_HOUR
    return CATALOG[key].dollars_per_hour if key in CATALOG else None


def cuda_accelerator_name(device_name: str) -> str | None:
    """Map torch.cuda.get_device_name() to a catalog key ('NVIDIA H100 80GB HBM3' -> h100-sxm)."""
    n = device_name.lower()
    if "h800" in n:
        return "h800"
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100-sxm"
    if "a100" in n:
        return "a100-80gb" if "80" in n else "a100-40gb"
    if "b200" in n:
        return "b200"
    return None


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


_cpu_cache: dict[int, Accelerator] = {}


def cpu_threads() -> int:
    """The matmul threads of this process (torch's setting; without torch, every core)."""
    import os

    torch = _torch()
    return torch.get_num_threads() if torch is not None else (os.cpu_count() or 1)


def measured_cpu(threads: int | None = None) -> Accelerator:
    """The CPU entry at `threads` matmul threads (default: this process's), its peaks
    measured once per host (fm_pipeline.cpu_peaks)."""
    from fm_pipeline.cpu_peaks import cpu_peak

    threads = cpu_threads() if threads is None else threads
    if threads not in _cpu_cache:
        fp32 = cpu_peak("fp32", threads=threads)
        bf16 = cpu_peak("bf16", threads=threads)
        _cpu_cache[threads] = Accelerator(
            name=f"cpu-{threads}t", peak_bf16_flops=max(bf16, fp32), peak_fp32_flops=fp32,
            memory_gib=24, memory_bw_gbps=20, intra_node_gbps=10, inter_node_gbps=1.25,
            dollars_per_hour=CPU_DOLLARS_PER_HOUR, matmul_efficiency=1.0, sm_count=1,
        )
    return _cpu_cache[threads]
