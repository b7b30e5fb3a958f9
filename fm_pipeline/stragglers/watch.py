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
reason, and the job keeps running. Record schema: fm_pipeline/resilience/events.py.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from fm_pipeline.rundir.events import append_event
from fm_pipeline.stragglers.detector import StragglerDetector, StragglerEvent
from fm_pipeline.stragglers.mitigation import exclusion_refusal, straggler_stops

log = logging.getLogger(__name__)


class StragglerWatch:
    def __init__(self, job, *, segment: str, world_size: int, gather_every: int,
                 mlflow: Any = None):
        r = job.resilience
        self.job = job
        self.segment = segment
        self.world_size = world_size
        self.gather_every = gather_every
        self.policy = r.straggler_policy
        self.detector = StragglerDetector(world_size=world_size, window=r.straggler_window,
                                          persist=r.straggler_persist)
        self.mlflow = mlflow  # fm_pipeline.train.tracking.MlflowSink (client, run_id)
        self.local_ranks: dict[int, int] = {}
        self.stop_reason: str | None = None
        self._ended: set[int] = set()  # ids of events whose straggler_end was written
        # Read once per segment: this segment stops at most once, whatever it raises.
        self.stops_before = straggler_stops(job.name) if self.policy == "exclude" else 0

    @classmethod
    def for_segment(cls, job, *, segment: str, world_size: int, gather_every: int,
                    mlflow: Any = None) -> StragglerWatch | None:
        """None when the policy is off or there is nobody to compare with."""
        if job.resilience.straggler_policy == "off" or world_size < 2:
            return None
        return cls(job, segment=segment, world_size=world_size, gather_every=gather_every,
                   mlflow=mlflow)

    def update(self, records: Iterable[Mapping[str, Any]]) -> str | None:
        """Score one gather; returns a stop reason the first time `exclude` wants one."""
        records = list(records)
        for r in records:
            self.local_ranks[int(r["rank"])] = int(r.get("local_rank", r["rank"]))
        raised = self.detector.update(records)
        stop = None
        budget = self.job.resilience.max_straggler_stops
        for event in raised:
            action, refused, extra = "reported", None, {}
            if self.policy == "exclude" and self.stops_before >= budget:
                # A persistent straggler would stop and resume the job forever.
                extra = {"budget_spent": f"{self.stops_before} straggler stop(s) of "
                                         f"max_straggler_stops {budget}: reported only"}
            elif self.policy == "exclude":
                refused = exclusion_refusal(self.job, 1)
                action = "exclude_refused" if refused else "exclude"
            self._append("straggler", **self._fields(event), policy=self.policy,
                         action=action, **({"refused": refused} if refused else {}), **extra)
            log.warning("straggler: rank %d (%s) %s +%.0f%% per step since step %d: %s",
                        event.rank, event.host, event.section, 100 * event.severity,
                        event.first_step, action + (f" ({refused})" if refused else "") +
                        (f" ({extra['budget_spent']})" if extra else ""))
            self._mlflow_raised(event, action)
            if action == "exclude" and self.stop_reason is None:
                stop = self.stop_reason = (
                    f"straggler: rank {event.rank} ({event.host}) {event.section} "
                    f"+{100 * event.severity:.0f}% per step; excluding its slot")
        for event in self.detector.events:
            if event.recovered_step is not None and id(event) not in self._ended:
                self._end(event, end_step=event.recovered_step)
        return stop

    def close(self, *, end_step: int) -> None:
        """The final record (cost so far) of every event not yet ended."""
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
        dollars = event.idle_gpu_hours * self.job.cluster.dollars_per_gpu_hour
        self._append("straggler_end", **self._fields(event), end_step=end_step,
                     policy=self.policy, idle_dollars=round(dollars, 6))

    def _append(self, kind: str, **fields: Any) -> None:
        try:
            append_event(self.job.name, kind, **fields)
        except OSError as e:  # a full disk must not turn a slow rank into a failed segment
            log.error("straggler event not written to the job's event log: %s", e)

    def _mlflow_raised(self, event: StragglerEvent, action: str) -> None:
        if self.mlflow is None:
            return
        from fm_pipeline.tracking import runs

        n = len(self.detector.events)
        try:  # tags are rare and small: set directly; metrics go through the sink's queue
            runs.set_tags(self.mlflow.client, self.mlflow.run_id, {
                f"fm.straggler.{n}": (f"rank {event.rank} ({event.host}) {event.section} "
                                      f"+{100 * event.severity:.0f}% from step "
                                      f"{event.first_step}: {action}")})
        except Exception as e:  # tracking must never take training down
            log.warning("MLflow straggler tag not set: %s", e)
        self.mlflow.log_metrics(event.detected_step, {"straggler.events": float(n),
                                                      "straggler.severity": event.severity})
