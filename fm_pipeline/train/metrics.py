"""What the trainer measures, and the JSON-lines files rank 0 writes under runs_dir(job).

Files (append-only; one JSON object per line; every record has "kind", "job", "segment"
(an id unique per torchrun launch), "time" (unix seconds)). A step can appear twice when a
segment failed after logging it and the next one redid it from an older checkpoint: take
the record of the latest segment.

metrics.jsonl, kind "step", every `training.log_every` steps:
    step               optimizer steps completed (1 = after the first update)
    loss               mean next-token cross-entropy of the step's global batch
    grad_norm          global L2 norm of the gradients before clipping (float64 sum)
    lr                 learning rate used by this step's update
    step_time_s        wall time of the step: data wait + forward/backward + optimizer
    tokens             tokens in the global batch (global_batch_size x seq_len)
    tokens_seen        tokens trained on since step 0 (all segments)
    tokens_per_s       tokens / step_time_s
    mfu                flops_per_token x tokens / (step_time_s x world_size x peak_flops);
                       null when the device's peak is unknown
    data_wait_s        rank 0's wait for its batch
    checkpoint_block_s time the loop was blocked by a checkpoint save after this step
                       (the probe-batch evaluation + staging for async saves, the whole
                       save for sync ones); 0 if none
    peak_memory_gib    rank 0's accelerator memory high-water mark during the step (GPU
                       only; null on CPU)
    process_cpu_s      CPU seconds rank 0's process used during the step, all threads
                       (host-side cost; on a shared CPU, steadier than wall time)

rank_timings.jsonl, kind "rank_timing", every `training.rank_timings_every` steps, one
record per global rank (gathered to rank 0); the fields of
fm_pipeline.train.stragglers.RankTiming:
    step, rank, host, local_rank
    peer_group         pipeline stage of the rank: only ranks of one group do equal work
    compute_s          per-step mean of forward/backward + optimizer time on this rank
    collective_wait_s  per-step mean of the time spent in the step's synchronising
                       all-reduce (loss + preemption flag) after backward: a rank that
                       finished early waits here for the slowest one
    data_wait_s        per-step mean of the time waiting for the data loader
    step_time_s        per-step mean of the whole step
    steps              steps averaged (the window since the previous record)

segments.jsonl, kind "segment", once per launch (rank 0, also on failure):
    start_step, end_step (reached), target_step, exit_code, exit_reason
    ("completed" | "preempted" | "failed" | "nothing_to_do"), error, final_loss,
    mean_mfu, tokens_per_s (mean over the segment's steps after the first),
    tokens_seen, checkpoint (path of the last committed one), checkpoint_block_s (sum),
    restored_from, resharded (the checkpoint was written under another topology),
    rng_restored, restore_s, preempt_reason ("signal SIGTERM", "flag file ...", or the
    straggler policy's reason), preempt_to_exit_s (from the request to the committed
    checkpoint), peak_memory_gib, wall_s, world_size, parallelism, accelerator,
    peak_flops_per_device.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from fm_pipeline.planner.hardware import (
    cuda_accelerator_name,
    get_accelerator,
    measure_matmul_flops,
    measured_cpu,
)

METRICS_FILE = "metrics.jsonl"
RANK_TIMINGS_FILE = "rank_timings.jsonl"
SEGMENTS_FILE = "segments.jsonl"


def peak_flops_per_device(device: torch.device, mixed_precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device for the compute dtype, the accelerator's name).

    GPUs: the catalog's dense datasheet figure (BF16, or TF32 for fp32 runs); unknown GPUs
    give None (no MFU rather than a wrong one). CPU: a matmul probe run now, in the
    dtype the model computes in, with the thread count of this process."""
    dtype = "bf16" if mixed_precision == "bf16" else "fp32"
    if device.type == "cuda":
        name = cuda_accelerator_name(torch.cuda.get_device_name(device))
        if name is None:
            return None, torch.cuda.get_device_name(device)
        return get_accelerator(name).peak_flops(dtype), name
    threads = torch.get_num_threads()
    if dtype == "fp32":  # the probe of one dtype is enough (half of measured_cpu's second)
        return measure_matmul_flops("fp32"), f"cpu-{threads}t"
    cpu = measured_cpu()
    return cpu.peak_flops(dtype), cpu.name


def mfu(*, flops_per_token: int, tokens: int, step_time_s: float, devices: int,
        peak_flops: float | None) -> float | None:
    if not peak_flops or step_time_s <= 0:
        return None
    return flops_per_token * tokens / (step_time_s * devices * peak_flops)


def host_name() -> str:
    return os.environ.get("HOSTNAME") or socket.gethostname()


class JsonLines:
    """Append-only JSON lines, flushed per record (readers tail them during the run)."""

    def __init__(self, path: Path, **common: Any):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.common = common
        self._file = open(path, "a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> dict:
        record = {"kind": kind, **self.common, "time": round(time.time(), 3), **fields}
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.close()


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_records(path: Path, kind: str | None = None) -> list[dict]:
    """All records of a metrics file (optionally one kind); a torn last line is ignored."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or record.get("kind") == kind:
            records.append(record)
    return records
