"""An independent reading of a chaos run's records, to hold the fault matrix's reported
figures against: plain JSON lines, nothing shared with fm_pipeline.resilience.figures."""

from __future__ import annotations

import json
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures_in(runs: Path) -> tuple[int, float | None, float | None]:
    """(steps recorded more than once, injection -> first segment end, injection or fix ->
    first step of a segment that had logged nothing before the injection)."""
    steps = [r for r in _lines(Path(runs) / "metrics.jsonl") if r.get("kind") == "step"]
    lost = len(steps) - len({r["step"] for r in steps})
    events = _lines(Path(runs) / "events.jsonl")
    faults = [e for e in events if e["kind"] == "fault_injected"]
    if not faults:
        return lost, None, None
    t = faults[0]["time"]
    ends = sorted(e["time"] for e in events if e["kind"] == "segment_ended" and e["time"] >= t)
    detect = round(ends[0] - t, 1) if ends and faults[0].get("detect", True) else None
    fixes = sorted(e["time"] for e in events if e["kind"] == "fault_cleared" and e["time"] >= t)
    since = fixes[0] if fixes else t
    old = {r["segment"] for r in steps if r["time"] <= t}
    later = sorted(r["time"] for r in steps if r["segment"] not in old and r["time"] > since)
    return lost, detect, (round(later[0] - since, 1) if later else None)


def assert_figures_agree(result, runs: Path) -> None:
    lost, detect, resume = figures_in(runs)
    assert (result.steps_lost, result.detect_s, result.resume_s) == (lost, detect, resume), (
        f"{result.fault}: the table says lost {result.steps_lost}, detected "
        f"{result.detect_s} s, resumed {result.resume_s} s; the records say {lost}, "
        f"{detect} s, {resume} s")
