"""The CPU's measured matmul peaks, kept per host: a probe costs about half a second per
dtype (plus torch's import on the control side) in every process that needs a peak (each
trainer rank for its MFU, each Dagster run that plans a CPU job), and the machine does not
change between them.

    cpu_peak("fp32", threads=1)     # FLOP/s; measured on the first call on this host

Kept per machine, not per site: in $XDG_CACHE_HOME/fm-pipeline/cpu-peaks.json (default
~/.cache/fm-pipeline/; $FM_CPU_PEAKS_FILE names another file), shared by every FM_HOME on
the machine, one entry per host, CPU model, core count, thread
count and matmul library (torch and its version, or numpy), with when it was measured.
Delete the file to measure again (after a BIOS or kernel change, say). Writers replace the
file whole; two processes measuring at once both measure, and the last write wins.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

CACHE_NAME = "cpu-peaks.json"
CACHE_ENV = "FM_CPU_PEAKS_FILE"


def cache_path() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "fm-pipeline" / CACHE_NAME


def cpu_peak(dtype: str, *, threads: int) -> float:
    """Peak FLOP/s of a square `dtype` matmul with `threads` threads on this host."""
    key = _key(dtype, threads)
    entries = _read()
    if key in entries:
        return float(entries[key]["flops"])
    flops = _measure(dtype, threads)
    entries = _read()  # another process may have written meanwhile
    entries[key] = {"flops": flops, "measured_at": time.time()}
    _write(entries)
    return flops


def has_torch() -> bool:
    """Whether torch can be imported here, without importing it."""
    try:
        return find_spec("torch") is not None
    except (ImportError, ValueError):  # an import hook that forbids it
        return False


def _key(dtype: str, threads: int) -> str:
    if has_torch():
        try:
            lib = f"torch-{metadata.version('torch')}"
        except metadata.PackageNotFoundError:  # importable without a distribution
            lib = "torch"
    else:
        lib, dtype = "numpy", "fp32"  # numpy has no bf16 matmul: the fp32 figure stands in
    return "|".join([socket.gethostname(), _cpu_model(), f"{os.cpu_count()}cores",
                     f"{threads}t", lib, dtype])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_matmul_flops(dtype: str = "fp32", *, size: int = 1024, seconds: float = 0.5) -> float:
    """Best sustained FLOP/s of a square matmul on this CPU with the current thread count
    (numpy's fp32 where torch is missing)."""
    if has_torch():
        import torch

        tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        a = torch.randn(size, size, dtype=tdtype)
        mm, b = torch.mm, torch.randn(size, size, dtype=tdtype)
    else:
        import numpy as np

        a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
        mm, b = np.matmul, a.copy()
    mm(a, b)  # warm up kernels and caches
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, 2 * size**3 / dt)
    return best


def _measure(dtype: str, threads: int) -> float:
    if not has_torch():
        return measure_matmul_flops("fp32")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure_matmul_flops(dtype)
    finally:
        torch.set_num_threads(before)


def _read() -> dict:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(entries: dict) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only FM_HOME measures every time: slower, never wrong
