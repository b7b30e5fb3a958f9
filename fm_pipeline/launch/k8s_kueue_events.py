"""What Kueue did to a segment's JobSet, appended to the job's event log (rundir/events.py)
as the launcher follows it, so the API lists Kueue's decisions beside the trainer's and
says `queued` while Kueue holds a segment:

    kind "kueue_queued"    jobset, reason: why the Workload has no quota yet (its
                           QuotaReserved message), or that it is suspended
    kind "kueue_admitted"  jobset
    kind "kueue_evicted"   jobset, reason (the Workload's Evicted condition: Preempted,
                           ...), message, evicted_at (unix seconds, the condition's
                           lastTransitionTime: Kueue's own clock, to the second)
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from fm_pipeline.launch.k8s_follow import JobSetStatus
from fm_pipeline.rundir.events import append_event

KUEUE_EVENTS = ("kueue_queued", "kueue_admitted", "kueue_evicted")
HOLDING = ("kueue_queued", "kueue_evicted")  # the last of these: Kueue holds the segment


class KueueEventLog:
    """`on_status` for JobSetClient.follow: one event per change of Kueue's hold."""

    def __init__(self, runs: Path, jobset: str, *, eviction: Callable[[], dict | None]):
        self.runs, self.jobset, self.eviction = Path(runs), jobset, eviction
        self.admitted = False
        self.said: tuple[str, str] | None = None

    def __call__(self, status: JobSetStatus) -> None:
        if status.phase in ("Pending", "Running", "Completed", "Failed") and not self.admitted:
            self.admitted = True
            self._say("kueue_admitted")
        elif status.phase in ("Suspended", "Evicted") and self.admitted:
            self.admitted = False
            self._say("kueue_evicted", **(self.eviction() or {"reason": "suspended"}))
        elif status.phase == "Suspended" and not self.admitted:
            self._say("kueue_queued", reason=status.message)

    def _say(self, kind: str, **fields) -> None:
        said = (kind, str(fields.get("reason", "")))
        if said != self.said:  # the same hold seen at every poll is one event
            self.said = said
            append_event(self.runs, kind, jobset=self.jobset, **fields)


def condition_time(text: str | None) -> float | None:
    """An RFC 3339 lastTransitionTime as unix seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
