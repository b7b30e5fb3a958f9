"""Stragglers: found while training, decided on, and kept out of the next launch.

    watch = StragglerWatch.for_segment(job, segment=..., world_size=4, mlflow=None,
                                       gather_every=10)       # rank 0, inside the segment
    reason = watch.update(records)       # a stop request when the policy excludes
    straggler_summary("demo")            # events, idle GPU-hours, what was excluded
    plan = plan_after_stragglers(job)    # the next launch without excluded slots/hosts

Modules: detector (per-rank timings -> straggler events; also used by fm_pipeline.sim),
watch (rank 0, live: events, MLflow, the stop request), history (the job's events and
their cost, an offline re-scan), mitigation (exclusions -> the next launch). Exports
resolve lazily: rank 0 imports the watch and must not pay for the rest.
"""

from __future__ import annotations

from fm_pipeline.lazy import lazy_exports

_EXPORTS = {
    "StragglerDetector": "detector", "RankTiming": "detector",
    "StragglerWatch": "watch",
    "straggler_summary": "history", "scan_rank_timings": "history",
    "ExclusionPlan": "mitigation", "plan_after_stragglers": "mitigation",
    "excluded_slots": "mitigation", "avoiding": "mitigation",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
