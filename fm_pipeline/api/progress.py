"""A job's progress as its own artifacts tell it: checkpoint manifests, their marks
(evaluations, drills), and the trainer's JSON lines (schema: fm_pipeline/rundir/records.py).
Read on every request, never cached, so the API cannot drift from what the job wrote.

Each reads the job's run directory `runs` (site.runs_dir(job)), which its caller names.

    checkpoints   runs/checkpoints/step-*/ and <store>/checkpoints/<job>/step-*/
    evaluations   the `eval` mark of each checkpoint (marks/eval.json)
    metrics       runs/metrics.jsonl, kind "step": the newest record
    goodput       step time of the steps that survive / GPU time held by the job's runs
    events        runs/segments.jsonl (one per torchrun launch: completed,
                  preempted, failed) and runs/events.jsonl (other producers,
                  e.g. straggler events: JSON lines with `kind` and `time`)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.rundir.records import EVENTS_FILE, METRICS_FILE, SEGMENTS_FILE, latest_record
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointSeen:
    step: int
    location: str
    tier: str
    committed: bool
    tokens_seen: int | None = None
    created_at: str | None = None
    total_bytes: int | None = None
    problem: str | None = None
    marks: tuple[str, ...] = ()
    eval: dict | None = None
    superseded: str | None = None  # why a rollback abandoned it (never resumed from)
    invalid: str | None = None  # what a restore found corrupt in it (never resumed from)


def checkpoints(job_name: str, store: ObjectStore | None, *,
                root: Path) -> list[CheckpointSeen]:
    """Every checkpoint directory of the job in both tiers, newest first, local before store."""
    from fm_pipeline.catalog import read_manifest, read_marks
    from fm_pipeline.catalog.refs import MANIFEST
    from fm_pipeline.catalog.supersede import superseded_reason
    from fm_pipeline.catalog.validate import candidates, invalid_reason

    try:
        refs = candidates(job_name, store=store, root=root)
    except StoreError as e:  # the local tier still answers while the store is down
        log.warning("checkpoints of %s: object store unreachable: %s", job_name, e)
        refs = candidates(job_name, store=None, root=root)
    seen = []
    for ref in refs:
        tier = "local" if ref.is_local else "store"
        try:
            manifest = read_manifest(ref)
            manifest_bytes = ref.read_bytes(MANIFEST)
            superseded = superseded_reason(ref, manifest_bytes)
            corrupt = invalid_reason(ref, manifest_bytes)
        except (FileNotFoundError, ValueError, StoreError) as e:
            seen.append(CheckpointSeen(ref.step, ref.location, tier, False, problem=str(e)))
            continue
        marks = read_marks(ref)
        seen.append(CheckpointSeen(
            step=ref.step, location=ref.location, tier=tier, committed=True,
            tokens_seen=manifest.tokens_seen, created_at=manifest.created_at,
            total_bytes=manifest.total_bytes, marks=tuple(sorted(marks)), eval=marks.get("eval"),
            superseded=superseded, invalid=corrupt,
            problem=f"superseded: {superseded}" if superseded else (
                f"invalid: {corrupt}" if corrupt else None),
        ))
    return seen


def last_committed(seen: list[CheckpointSeen]) -> CheckpointSeen | None:
    """The newest committed checkpoint a resume would consider (superseded ones are not)."""
    return next((c for c in seen if c.committed and c.superseded is None and c.invalid is None),
                None)


def latest_metrics(runs: Path) -> dict:
    """The newest complete step record of the job ({} if it has not stepped yet)."""
    record = latest_record(Path(runs) / METRICS_FILE, "step")
    return record if isinstance(record.get("step"), int) else {}


def productive_seconds(runs: Path) -> float:
    """Step time of every step that counts: a step redone after a failure counts once,
    with the record of the latest segment (the one whose weights survived)."""
    per_step: dict[int, float] = {}
    path = Path(runs) / METRICS_FILE
    if not path.is_file():
        return 0.0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            record = _json(line)
            step, seconds = record.get("step"), record.get("step_time_s")
            if record.get("kind") == "step" and isinstance(step, int) and isinstance(
                    seconds, (int, float)):
                per_step[step] = float(seconds)
    return sum(per_step.values())


def job_events(runs: Path) -> list[dict]:
    """Segment ends from the trainer and events from other producers, as {at, kind, detail}."""
    events = []
    for name in (SEGMENTS_FILE, EVENTS_FILE):
        path = Path(runs) / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            record = _json(line)
            kind = record.pop("kind", None)
            if not isinstance(kind, str):
                continue
            at = record.pop("time", record.pop("at", 0.0))
            if kind == "segment":
                kind = f"segment_{record.get('exit_reason', 'ended')}"
            events.append({"at": float(at) if isinstance(at, (int, float)) else 0.0,
                           "kind": kind, "detail": record})
    return events


def kueue_hold(events: list[dict]) -> str | None:
    """Why Kueue holds the job's segment now (its last Kueue event queued or evicted it),
    from the events the Kubernetes launcher logs (launch/k8s_kueue_events.py); None if it
    does not."""
    from fm_pipeline.launch.k8s_kueue_events import HOLDING, KUEUE_EVENTS

    said = [e for e in sorted(events, key=lambda e: e["at"]) if e["kind"] in KUEUE_EVENTS]
    if not said or said[-1]["kind"] not in HOLDING:
        return None
    detail = said[-1]["detail"]
    what = "evicted by Kueue" if said[-1]["kind"] == "kueue_evicted" else "queued in Kueue"
    why = detail.get("message") or detail.get("reason")
    return f"{what} (JobSet {detail.get('jobset')})" + (f": {why}" if why else "")


def _json(line: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError:
        return {}  # a torn line being written
    return record if isinstance(record, dict) else {}
