"""The job's event log, <runs dir>/events.jsonl: what happened to a job besides its steps.

    runs = site.runs_dir("demo")                                            # the caller's Site
    append_event(runs, "straggler", rank=1, host="node-a", ...)
    events, offset = read_events(runs, kinds=("straggler",), offset=0)     # tail from offset

One JSON object per line, appended with a single write (readers may tail it while it
grows; a torn last line is skipped and re-read once complete). Every record has
    kind   what it is (below)
    time   unix seconds
    job    the job's name
The API (fm_pipeline.api.progress.job_events) lists every record as an event of the job.

kind "straggler" (rank 0 of the trainer, when the detector raises an event):
    segment            the trainer's segment id (metrics.jsonl "segment")
    rank, host, local_rank, section ("compute" | "data_wait" | "collective_wait")
    severity           median excess over the peers / a healthy step (0.5: +50% per step)
    section_ratio, z, first_step, detected_step, last_step
    idle_gpu_hours     the other ranks' GPU time spent waiting so far
    world_size, gather_every (steps between gathered samples)
    policy             the job's resilience.straggler_policy ("report" | "exclude" |
                       "drop" | "auto")
    action             "reported" | "exclude" (stop at the next step, checkpoint, restart
                       without the slot) | "exclude_refused" (with `refused`: why);
                       "reported" with `budget_spent` when exclude has used its
                       resilience.max_straggler_stops | "drop" (the rank computes fewer
                       rows of each micro-batch from the next step) | "drop_refused"
                       (with `refused`); auto's stop after a drop: "exclude" with
                       switched_from "drop"
    cost               drop/auto (fm_pipeline.stragglers.drop): rows_kept, rows,
                       tokens_dropped_per_step, drop_cost_gpu_s_per_step,
                       idle_gpu_s_per_step_without, relaunch_cost_gpu_s, break_even_steps,
                       drop_cost_gpu_s_so_far
kind "straggler_drop" (rank 0, a drop's rows changed): rank, host, step, ratio, the cost
kind "straggler_drop_end" (rank 0): rank, host, since_step, end_step, why ("recovered" |
    "switched to exclude" | "segment ended"), tokens_dropped, drop_cost_gpu_s, ratio
kind "straggler_end" (rank 0, when the rank recovers or the segment ends):
    the fields above with their final values, plus recovered_step (null: still slow at
    the segment's end), end_step, idle_dollars (idle_gpu_hours x the cluster's price per GPU-hour)
kind "exclusions_cleared" (an operator, fm chaos clear-exclusions): slots and hosts
    excluded before this record may be used again
kind "exclusion_applied" (the segment asset, before a launch): excluded (host,
    local_rank, rank, reason per slot), avoid_hosts, world_size (planned) and
    world_size_before, note
kind "fault_injected" (fm chaos): fault, target, step
kind "kueue_queued" | "kueue_admitted" | "kueue_evicted" (the Kubernetes launcher, as it
    follows a JobSet): jobset, reason, and for an eviction message and evicted_at
    (fm_pipeline.launch.k8s_kueue_events)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

from fm_pipeline.rundir.records import EVENTS_FILE


def events_path(runs: Path) -> Path:
    return Path(runs) / EVENTS_FILE


def append_event(runs: Path, kind: str, *, job: str | None = None,
                 **fields: Any) -> dict[str, Any]:
    """Append one record to the log in the job's run directory `runs` (its name is the job's
    unless `job` says otherwise); returns it. One write() of one line: concurrent appenders
    (rank 0, the chaos runner, an operator) never interleave within a record."""
    if not kind:
        raise ValueError("an event needs a kind")
    runs = Path(runs)
    record = {"kind": kind, "time": round(time.time(), 3), "job": job or runs.name, **fields}
    path = events_path(runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=_plain) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return record


def read_events(runs: Path, *, kinds: Iterable[str] | None = None,
                offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Records from byte `offset` on (optionally of some kinds) and the offset to continue
    from: a sensor keeps it as its cursor and never sees a record twice."""
    path = events_path(runs)
    wanted = set(kinds) if kinds is not None else None
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data.rfind(b"\n") + 1  # a line still being written is read next time
    records = []
    for line in data[:complete].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and (wanted is None or record.get("kind") in wanted):
            records.append(record)
    return records, offset + complete


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
