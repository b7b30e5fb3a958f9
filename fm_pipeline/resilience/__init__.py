"""Resilience: faults injected into real runs, multi-node runs in network namespaces,
straggler mitigation and the job's event log.

    fm chaos run                          # the fault matrix -> docs/fault-matrix.md
    fm chaos run --faults kill-rank,hang-rank
    fm chaos stragglers --job demo        # straggler events, their cost, the exclusions

    from fm_pipeline.resilience import plan_after_stragglers, read_events, straggler_summary
    events, cursor = read_events("demo", kinds=("straggler",), offset=cursor)  # a sensor
    plan = plan_after_stragglers(job)     # the next launch without excluded slots/hosts

Modules: events (events.jsonl schema), straggler_watch (rank 0, live), stragglers (history,
cost, offline scan), mitigation (exclusions -> next launch), processes (a live local
segment, its workers, signals), injectors (checkpoint/data/disk/S3 faults), netns (network
namespaces joined by veth pairs), multinode (the pod command as nodes), scenarios + matrix
(the fault matrix), docs/resilience.md. Exports resolve lazily: rank 0 imports
straggler_watch and must not pay for the rest.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EVENTS_FILE": "events", "append_event": "events", "read_events": "events",
    "events_path": "events",
    "StragglerWatch": "straggler_watch",
    "straggler_summary": "stragglers", "scan_rank_timings": "stragglers",
    "ExclusionPlan": "mitigation", "plan_after_stragglers": "mitigation",
    "excluded_slots": "mitigation", "avoiding": "mitigation",
    "FaultResult": "matrix", "run_matrix": "matrix", "FAULTS": "matrix",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fm_pipeline.resilience' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fm_pipeline.resilience.{_EXPORTS[name]}"), name)
