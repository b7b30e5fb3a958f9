"""The fault matrix's figures, read from the run's own records, never set by a scenario.

    figures = figures_from_records(site.runs_dir(job.name))
    figures.steps_lost, figures.detect_s, figures.resume_s

Records read (all under the job's run directory):
  metrics.jsonl  rank 0's step records: "step", "time" (end of the step), "segment" (an id
                 per torchrun launch)
  events.jsonl   "fault_injected" (time of the injection; `detect: false` where no segment
                 end marks its detection: a fault the run rides through (S3 down), one
                 present from the start (a full disk), damage at rest found by the next
                 restore), "fault_cleared" (an operator's fix, for faults that need one),
                 "segment_ended" (the launcher saw the segment's processes end)

  steps_lost  steps rank 0 recorded more than once: trained before the fault, then again
              after the resume restored an older checkpoint
  detect_s    fault_injected -> the first segment_ended after it
  resume_s    fault_injected (or the fault_cleared after it) -> the first step record of a
              segment that had logged no step before the fault
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.rundir.events import read_events
from fm_pipeline.rundir.records import METRICS_FILE, read_records

FAULT, CLEARED, ENDED = "fault_injected", "fault_cleared", "segment_ended"


@dataclass(frozen=True)
class Figures:
    steps_lost: int | None
    detect_s: float | None
    resume_s: float | None


def figures_from_records(runs: Path) -> Figures:
    steps = read_records(Path(runs) / METRICS_FILE, "step")
    counts = Counter(r["step"] for r in steps)
    lost = sum(n - 1 for n in counts.values() if n > 1)
    events, _ = read_events(runs, kinds=(FAULT, CLEARED, ENDED))
    fault = next((e for e in events if e["kind"] == FAULT), None)
    if fault is None:
        return Figures(steps_lost=lost, detect_s=None, resume_s=None)
    at = fault["time"]
    detect = None
    if fault.get("detect", True):
        ended = next((e for e in events if e["kind"] == ENDED and e["time"] >= at), None)
        detect = round(ended["time"] - at, 1) if ended else None
    cleared = next((e for e in events if e["kind"] == CLEARED and e["time"] >= at), None)
    since = cleared["time"] if cleared else at
    before = {r.get("segment") for r in steps if r["time"] <= at}
    first = next((r for r in steps if r["time"] > since and r.get("segment") not in before),
                 None)
    resume = round(first["time"] - since, 1) if first else None
    return Figures(steps_lost=lost, detect_s=detect, resume_s=resume)
