"""A job's stragglers after the fact: the events rank 0 wrote, what they cost, and an
offline scan of rank_timings.jsonl (for runs whose policy was off, or to re-check).

    summary = straggler_summary(job)          # events, idle GPU-hours, dollars, exclusions
    found = scan_rank_timings("demo")         # {segment: [StragglerEvent, ...]}

The Dagster sensor and the API call these; the trainer's rank 0 writes the events
(fm_pipeline.stragglers.watch). Cost: a straggler's idle GPU-hours are the time
every other rank waited for it (StragglerDetector's accounting), taken from each event's
last record ("straggler_end" when written, else the "straggler" record).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from fm_pipeline.rundir.events import read_events
from fm_pipeline.rundir.records import RANK_TIMINGS_FILE
from fm_pipeline.stragglers.detector import StragglerDetector, StragglerEvent
from fm_pipeline.stragglers.mitigation import excluded_slots


def _event_key(record: dict) -> tuple:
    return (record.get("segment"), record.get("rank"), record.get("section"),
            record.get("first_step"))


def straggler_events(runs: Path) -> list[dict[str, Any]]:
    """One dict per straggler event (its latest record), in the order they were raised, from
    the job's run directory `runs`."""
    records, _ = read_events(runs, kinds=("straggler", "straggler_end"))
    latest: dict[tuple, dict] = {}
    for r in records:
        key = _event_key(r)
        if r["kind"] == "straggler" or key in latest:
            raised = latest.get(key, {})
            latest[key] = {**raised, **r, "action": raised.get("action", r.get("action"))}
        else:  # an end whose raise record was lost (a full disk at that moment)
            latest[key] = r
    return list(latest.values())


def straggler_summary(job, runs: Path) -> dict[str, Any]:
    """Events, their cost and the current exclusions of `job` (a JobSpec) from its run
    directory `runs`."""
    events = straggler_events(runs)
    hours = sum(float(e.get("idle_gpu_hours") or 0.0) for e in events)
    return {
        "events": events,
        "stragglers": len(events),
        "unrecovered": sum(1 for e in events if e.get("recovered_step") is None),
        "idle_gpu_hours": hours,
        "idle_dollars": hours * job.cluster.price_per_gpu_hour,
        "excluded": [vars(s) for s in excluded_slots(runs)],
    }


def scan_rank_timings(runs: Path, **detector_kwargs: Any) -> dict[str, list[StragglerEvent]]:
    """Run a fresh StragglerDetector over each segment's gathered timings (one detector per
    segment: ranks and hosts change between launches)."""
    from fm_pipeline.rundir.records import read_records

    by_segment: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in read_records(Path(runs) / RANK_TIMINGS_FILE, "rank_timing"):
        by_segment[r.get("segment", "?")][int(r["step"])].append(r)
    found: dict[str, list[StragglerEvent]] = {}
    for segment, steps in by_segment.items():
        world = {len(rs) for rs in steps.values()}
        if max(world) < 2:
            found[segment] = []
            continue
        detector = StragglerDetector(**detector_kwargs)
        for step in sorted(steps):
            if len(steps[step]) == max(world):  # a gather cut short by a failure is skipped
                detector.update(steps[step])
        found[segment] = detector.events
    return found
