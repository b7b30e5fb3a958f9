"""Straggler detection during a segment, on rank 0: events to events.jsonl and MLflow, and
the stop that the `exclude` policy asks for.

    watch = StragglerWatch.for_segment(job, segment=seg_id, world_size=4, gather_every=10)
    stop_reason = watch.update(gathered_records)   # every gather (rank_timings.jsonl records)
    if stop_reason: preemption_watcher.request(stop_reason)   # checkpoint, exit 75
    watch.close(end_step=step)                     # final cost of every event

The detector is fm_pipeline.stragglers.detector.StragglerDetector (window/persist from the
job's resilience section). Policies: "report" writes events; "exclude" also asks the
segment to stop at the next step boundary with a checkpoint (exit 75, nothing lost), after
which fm_pipeline.stragglers.mitigation.plan_after_stragglers gives the launch without the
slot. An exclusion the layout cannot absorb is written as "exclude_refused" with the
reason, and the job keeps running. "drop" has the slow rank compute fewer rows of each
micro-batch (fm_pipeline.stragglers.drop; `row_plan()` is what the trainer sends); "auto"
drops, and stops to exclude once the dropped work has cost one relaunch, or at once where
it cannot drop. Record schema: fm_pipeline/rundir/events.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

from fm_pipeline.rundir.events import append_event
from fm_pipeline.stragglers.detector import StragglerDetector, StragglerEvent
from fm_pipeline.stragglers.drop import DropController
from fm_pipeline.stragglers.mitigation import exclusion_refusal, straggler_stops

log = logging.getLogger(__name__)


class StragglerWatch:
    def __init__(self, job, *, runs: Path, segment: str, world_size: int, gather_every: int,
                 mlflow: Any = None):
        r = job.resilience
        self.job, self.runs = job, Path(runs)  # the job's run directory: its event log
        self.segment = segment
        self.world_size = world_size
        self.gather_every = gather_every
        self.policy = r.straggler_policy
        self.detector = StragglerDetector(world_size=world_size, window=r.straggler_window,
                                          persist=r.straggler_persist)
        self.mlflow = mlflow  # fm_pipeline.train.tracking.MlflowSink
        self.local_ranks: dict[int, int] = {}
        self.stop_reason: str | None = None
        self._ended: set[int] = set()  # ids of events whose straggler_end was written
        # Read once per segment: this segment stops at most once, whatever it raises.
        self.stops_before = straggler_stops(self.runs) if self.policy in ("exclude", "auto") \
            else 0
        self.drops = (DropController.for_job(job, world_size=world_size)
                      if self.policy in ("drop", "auto") else None)

    @classmethod
    def for_segment(cls, job, *, runs: Path, segment: str, world_size: int,
                    gather_every: int, mlflow: Any = None) -> StragglerWatch | None:
        """None when the policy is off or there is nobody to compare with."""
        if job.resilience.straggler_policy == "off" or world_size < 2:
            return None
        return cls(job, runs=runs, segment=segment, world_size=world_size, gather_every=gather_every,
                   mlflow=mlflow)

    def update(self, records: Iterable[Mapping[str, Any]]) -> str | None:
        """Score one gather; returns a stop reason the first time the policy wants one."""
        records = list(records)
        for r in records:
            self.local_ranks[int(r["rank"])] = int(r.get("local_rank", r["rank"]))
        if self.drops is not None:
            for kind, fields in self.drops.account(records):
                self._append(kind, segment=self.segment, policy=self.policy, **fields)
        raised = self.detector.update(records)
        stop = None
        for event in raised:
            action, refused, extra = "reported", None, {}
            wants_stop = self.policy == "exclude"
            if self.stop_reason is not None:  # already stopping at the next step
                wants_stop, extra = False, {"stopping": self.stop_reason}
            elif self.drops is not None:
                action, refused, cost = self.drops.start(event, records)
                extra = {"cost": cost} if cost else {}
                if action == "drop_refused" and self.policy == "auto":
                    wants_stop, extra = True, {"drop_refused": refused}
            if wants_stop:
                action, refused, budget = self._exclusion()
                extra.update(budget)
            self._append("straggler", **self._fields(event), policy=self.policy,
                         action=action, **({"refused": refused} if refused else {}), **extra)
            log.warning("straggler: rank %d (%s) %s +%.0f%% per step since step %d: %s",
                        event.rank, event.host, event.section, 100 * event.severity,
                        event.first_step, action + (f" ({refused})" if refused else "") +
                        (f" ({extra['budget_spent']})" if "budget_spent" in extra else ""))
            self._mlflow_raised(event, action)
            if action == "exclude" and self.stop_reason is None:
                stop = self.stop_reason = (
                    f"straggler: rank {event.rank} ({event.host}) {event.section} "
                    f"+{100 * event.severity:.0f}% per step; excluding its slot")
        if self.policy == "auto" and self.stop_reason is None:
            stop = self._switch_to_exclusion(records) or stop
        for event in self.detector.events:
            if event.recovered_step is not None and id(event) not in self._ended:
                self._end(event, end_step=event.recovered_step)
        return stop

    def row_plan(self) -> list[int] | None:
        """Rows per micro-batch for every dp rank while a drop is in force (the trainer
        sends it with the next step's sync), else None."""
        return self.drops.plan() if self.drops is not None and self.stop_reason is None \
            else None

    def _exclusion(self) -> tuple[str, str | None, dict]:
        """(action, refusal, budget note) for a stop to exclude the slot."""
        budget = self.job.resilience.max_straggler_stops
        if self.stops_before >= budget:
            # A persistent straggler would stop and resume the job forever.
            return "reported", None, {"budget_spent": f"{self.stops_before} straggler stop(s) "
                                                      f"of max_straggler_stops {budget}: "
                                                      "reported only"}
        refused = exclusion_refusal(self.job, 1)
        return ("exclude_refused" if refused else "exclude"), refused, {}

    def _switch_to_exclusion(self, records) -> str | None:
        """auto: a drop that has cost one relaunch becomes a stop to exclude the slot."""
        due = self.drops.due_for_relaunch()
        if due is None:
            return None
        step = max(int(r["step"]) for r in records)
        action, refused, budget = self._exclusion()
        if action != "exclude":
            return None  # keep dropping: a stop is not possible or not allowed
        cost = self.drops.arithmetic(due)
        ended = self.drops.end(due.rank, step, "switched to exclude")
        event = next((e for e in reversed(self.detector.events) if e.rank == due.rank), None)
        fields = self._fields(event) if event is not None else {
            "segment": self.segment, "rank": due.rank, "host": due.host,
            "local_rank": self.local_ranks.get(due.rank, due.rank), "section": "compute",
            "world_size": self.world_size, "gather_every": self.gather_every}
        self._append("straggler_drop_end", segment=self.segment, policy=self.policy, **ended)
        self._append("straggler", **{**fields, "detected_step": step}, policy=self.policy,
                     action="exclude", switched_from="drop", cost=cost, **budget)
        log.warning("straggler: rank %d (%s): the drop has cost %.1f GPU-s, one relaunch "
                    "(%.1f GPU-s): stopping to exclude its slot", due.rank, due.host,
                    due.cost_gpu_s, self.drops.relaunch_cost_gpu_s)
        self.stop_reason = (f"straggler: rank {due.rank} ({due.host}) dropped rows cost "
                            f"{due.cost_gpu_s:.1f} GPU-s >= one relaunch "
                            f"({self.drops.relaunch_cost_gpu_s:.1f}); excluding its slot")
        return self.stop_reason

    def close(self, *, end_step: int) -> None:
        """The final record (cost so far) of every event and drop not yet ended."""
        if self.drops is not None:
            for rank in list(self.drops.drops):
                self._append("straggler_drop_end", segment=self.segment, policy=self.policy,
                             **self.drops.end(rank, end_step, "segment ended"))
        for event in self.detector.events:
            if id(event) not in self._ended:
                self._end(event, end_step=end_step)
        if self.mlflow is not None and self.detector.events:
            self.mlflow.log_metrics(end_step, {
                "straggler.idle_gpu_hours": self.detector.idle_gpu_hours,
                "straggler.events": float(len(self.detector.events))})

    # --- records -----------------------------------------------------------------------

    def _fields(self, event: StragglerEvent) -> dict[str, Any]:
        return {"segment": self.segment, **event.to_dict(),
                "local_rank": self.local_ranks.get(event.rank, event.rank),
                "world_size": self.world_size, "gather_every": self.gather_every}

    def _end(self, event: StragglerEvent, *, end_step: int) -> None:
        self._ended.add(id(event))
        dollars = event.idle_gpu_hours * self.job.cluster.price_per_gpu_hour
        self._append("straggler_end", **self._fields(event), end_step=end_step,
                     policy=self.policy, idle_dollars=round(dollars, 6))

    def _append(self, kind: str, **fields: Any) -> None:
        try:
            append_event(self.runs, kind, **fields)
        except OSError as e:  # a full disk must not turn a slow rank into a failed segment
            log.error("straggler event not written to the job's event log: %s", e)

    def _mlflow_raised(self, event: StragglerEvent, action: str) -> None:
        if self.mlflow is None:
            return
        n = len(self.detector.events)
        self.mlflow.set_tags({  # queued like the metrics: the sink's thread sets them
            f"fm.straggler.{n}": (f"rank {event.rank} ({event.host}) {event.section} "
                                  f"+{100 * event.severity:.0f}% from step "
                                  f"{event.first_step}: {action}")})
        self.mlflow.log_metrics(event.detected_step, {"straggler.events": float(n),
                                                      "straggler.severity": event.severity})
