"""The JSON-lines files rank 0 of the trainer writes in the job's run directory
(site.runs_dir(job)), and reading them.

    runs = site.runs_dir(job)
    log = JsonLines(runs / METRICS_FILE, job=job, segment=seg)   # the trainer
    records = read_records(runs / SEGMENTS_FILE, "segment")        # anyone
    latest_record(runs / METRICS_FILE, "step")                     # tail, cheap

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
fm_pipeline.stragglers.detector.RankTiming:
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
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
RANK_TIMINGS_FILE = "rank_timings.jsonl"
SEGMENTS_FILE = "segments.jsonl"
EVENTS_FILE = "events.jsonl"  # fm_pipeline.rundir.events
_TAIL_BYTES = 64 * 1024


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
    if hasattr(value, "numel") and hasattr(value, "tolist"):  # a tensor, without importing torch
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


def tail_lines(path: Path, max_bytes: int = _TAIL_BYTES) -> list[str]:
    """The complete lines among the last `max_bytes` of a file ([] if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            chunk = f.read()
    except FileNotFoundError:
        return []
    lines = chunk.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if size > max_bytes else lines  # the first may be cut


def latest_record(path: Path, kind: str) -> dict:
    """The newest complete record of `kind`, read from the file's tail ({} if none)."""
    for line in reversed(tail_lines(path)):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == kind:
            return record
    return {}
