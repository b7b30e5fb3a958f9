"""The segment plans a job's launches followed, read back from its event log
("segment_planned", written by orchestration.segments.prepare_segment whichever
orchestrator launched the segment)."""

from __future__ import annotations

from fm_pipeline.rundir.events import read_events
from tests import local_site

# One job shape and one planted fault that both orchestrators run (the local one in
# tests/api/test_local_orchestrator.py, the Dagster path in tests/orchestration/
# test_sensors.py); each must launch exactly these plans.
SHAPE = {"training.steps": 6, "training.segment_steps": 2, "checkpoint.every_steps": 2}
FAULT = "0:3"  # the segment 2 -> 4 fails after step 3, once
PLANS = [(0, 2, None, False), (2, 4, 2, False), (2, 4, 2, False), (4, 6, 4, False)]


def planned_segments(job_name: str) -> list[tuple[int, int, int | None, bool]]:
    """(start, end, step of the checkpoint it starts from or None, chosen) per launch."""
    planned, _ = read_events(local_site.runs_dir(job_name), kinds=("segment_planned",))
    return [(p["start"], p["end"], step_of(p["checkpoint"]), p["chosen"]) for p in planned]


def step_of(location) -> int | None:
    """The step of a checkpoint location (a directory or store URI ending in step-N);
    None for no checkpoint ("scratch", None, "")."""
    if not location or location == "scratch":
        return None
    return int(str(location).rstrip("/").rsplit("step-", 1)[1])
