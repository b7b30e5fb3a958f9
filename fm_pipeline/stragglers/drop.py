"""The straggler drop: a slow rank computes fewer rows of each micro-batch so that its peers
stop waiting for it, and the arithmetic the `auto` policy uses to choose between that and a
stop-and-relaunch.

    drops = DropController.for_job(job, world_size=4)
    action, refused, cost = drops.start(event, records)    # on a raised compute straggler
    notes = drops.account(records)                          # every gather: cost, recovery
    trainer.next_row_plan = drops.plan()                    # rows per micro-batch per rank

The trainer (fm_pipeline.train.trainer) applies the plan from the step after rank 0 sent it:
the slow rank computes `rows` of each micro-batch's `full` rows, every rank scales its
gradient so the average is the mean over the rows computed, and the rows not computed are
lost tokens. Costs, in GPU-seconds:

  waiting    the peers' idle time per step (what `report` pays; the detector measures it)
  drop       per step, the work of the rows not computed: their share of the global batch x
             the step time x the world size (what computing those tokens again would take)
  relaunch   once: resilience.relaunch_cost_s x the world size (every GPU idle from the stop
             to the first resumed step)

`drop` keeps dropping while the rank is slow. `auto` drops at once (a short stall then costs
a few rows) and stops with a checkpoint to exclude the slot once the drop's accumulated cost
reaches one relaunch: the rent-or-buy rule, whose total cost is at most twice that of the
better of the two choices made in hindsight, whatever the stall's length. The numbers of
that choice are in the event.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

RECOVERED_BELOW = 1.15  # rows-time ratio to the peers under which the rank is back to normal


@dataclass
class Drop:
    rank: int
    host: str
    rows: int  # rows of each micro-batch it computes
    since_step: int
    ratio: float  # its time per row / its peers' when last measured
    tokens: int = 0  # tokens not computed so far
    cost_gpu_s: float = 0.0  # their work, accumulated


def rows_ratio(records: list[Mapping[str, Any]], rank: int) -> float | None:
    """A rank's forward/backward time per row against the median of the others'."""
    def per_row(r):
        fraction = float(r.get("work_fraction") or 1.0)
        return float(r.get("rows_s") or 0.0) / fraction

    mine = [per_row(r) for r in records if int(r["rank"]) == rank]
    peers = [per_row(r) for r in records if int(r["rank"]) != rank]
    if not mine or not peers or statistics.median(peers) <= 0:
        return None
    return mine[0] / statistics.median(peers)


class DropController:
    def __init__(self, *, full_rows: int, dp: int, world_size: int, tokens_per_step: int,
                 relaunch_cost_s: float, refusal: str | None = None):
        self.full_rows, self.dp, self.world = full_rows, dp, world_size
        self.tokens_per_step = tokens_per_step
        self.relaunch_cost_s = relaunch_cost_s
        self.refusal = refusal  # why this layout cannot drop, if it cannot
        self.drops: dict[int, Drop] = {}
        self.step_time_s = 0.0  # median step time of the last gather

    @classmethod
    def for_job(cls, job, *, world_size: int) -> DropController:
        p = job.parallelism
        refusal = None
        if p.tp > 1 or p.pp > 1:
            refusal = (f"tp {p.tp} x pp {p.pp}: the ranks of a tp group share their inputs "
                       "and a pipeline schedule fixes the micro-batch shape")
        return cls(full_rows=job.training.micro_batch_size, dp=p.dp, world_size=world_size,
                   tokens_per_step=job.tokens_per_step,
                   relaunch_cost_s=job.resilience.relaunch_cost_s, refusal=refusal)

    # --- the arithmetic ------------------------------------------------------------------

    def drop_cost_per_step(self, rows: int) -> float:
        """GPU-seconds per step of the work one rank computing `rows` leaves undone."""
        fraction = (self.full_rows - rows) / (self.full_rows * self.dp)
        return fraction * self.step_time_s * self.world

    @property
    def relaunch_cost_gpu_s(self) -> float:
        return self.relaunch_cost_s * self.world

    def arithmetic(self, drop: Drop, *, idle_gpu_s_per_step: float | None = None) -> dict:
        per_step = self.drop_cost_per_step(drop.rows)
        return {
            "rows_kept": drop.rows, "rows": self.full_rows,
            "tokens_dropped_per_step": self._tokens_per_step(drop.rows),
            "drop_cost_gpu_s_per_step": round(per_step, 6),
            "idle_gpu_s_per_step_without": (None if idle_gpu_s_per_step is None
                                            else round(idle_gpu_s_per_step, 6)),
            "relaunch_cost_gpu_s": round(self.relaunch_cost_gpu_s, 3),
            "break_even_steps": (round(self.relaunch_cost_gpu_s / per_step, 1)
                                 if per_step > 0 else None),
            "drop_cost_gpu_s_so_far": round(drop.cost_gpu_s, 6),
        }

    def _tokens_per_step(self, rows: int) -> int:
        return round(self.tokens_per_step * (self.full_rows - rows) / (self.full_rows * self.dp))

    # --- decisions -----------------------------------------------------------------------

    def start(self, event, records: list[Mapping[str, Any]]) -> tuple[str, str | None, dict]:
        """On a raised straggler: ("drop", None, arithmetic) or ("drop_refused", why, {})."""
        self._step_time(records)
        if self.refusal:
            return "drop_refused", self.refusal, {}
        if event.section != "compute":
            return "drop_refused", (f"its {event.section} is slow: computing fewer rows does "
                                    "not shorten it"), {}
        # Time per row against the peers' (normalised by the rows it computes, so a rank
        # already dropping is measured like one that is not).
        ratio = rows_ratio(records, event.rank) or event.section_ratio
        current = self.drops.get(event.rank)
        rows = max(1, math.floor(self.full_rows / max(ratio, 1.0)))
        if rows >= self.full_rows:
            return "drop_refused", (f"{100 * (ratio - 1):.0f}% slower per row is less than "
                                    f"one row of {self.full_rows}"), {}
        drop = current or Drop(rank=event.rank, host=event.host, rows=rows,
                               since_step=event.detected_step, ratio=ratio)
        drop.rows, drop.ratio = rows, ratio
        self.drops[event.rank] = drop
        idle = event.severity * self.step_time_s * (self.world - 1)
        return "drop", None, self.arithmetic(drop, idle_gpu_s_per_step=idle)

    def account(self, records: list[Mapping[str, Any]]) -> list[tuple[str, dict]]:
        """One gather: the drops' cost so far, the ones whose rank recovered (ended) and the
        ones whose rows changed. Returns event records to write, (kind, fields)."""
        self._step_time(records)
        steps = max((int(r.get("steps", 1)) for r in records), default=1)
        step = max((int(r["step"]) for r in records), default=0)
        notes = []
        for rank, drop in list(self.drops.items()):
            drop.tokens += steps * self._tokens_per_step(drop.rows)
            drop.cost_gpu_s += steps * self.drop_cost_per_step(drop.rows)
            ratio = rows_ratio(records, rank)
            if ratio is None:
                continue
            drop.ratio = ratio
            if ratio < RECOVERED_BELOW:
                notes.append(("straggler_drop_end", self.end(rank, step, "recovered")))
                continue
            rows = max(1, min(self.full_rows - 1, math.floor(self.full_rows / ratio)))
            if rows != drop.rows:
                drop.rows = rows
                notes.append(("straggler_drop", {"rank": rank, "host": drop.host, "step": step,
                                                 "change": "rows", "ratio": round(ratio, 3),
                                                 **self.arithmetic(drop)}))
        return notes

    def due_for_relaunch(self) -> Drop | None:
        """The drop whose accumulated cost has reached one relaunch (auto switches)."""
        due = [d for d in self.drops.values() if d.cost_gpu_s >= self.relaunch_cost_gpu_s]
        return max(due, key=lambda d: d.cost_gpu_s) if due else None

    def end(self, rank: int, step: int, why: str) -> dict:
        drop = self.drops.pop(rank)
        return {"rank": rank, "host": drop.host, "since_step": drop.since_step,
                "end_step": step, "why": why, "tokens_dropped": drop.tokens,
                "drop_cost_gpu_s": round(drop.cost_gpu_s, 6), "ratio": round(drop.ratio, 3)}

    def plan(self) -> list[int] | None:
        """Rows per micro-batch for every dp rank, or None when nobody drops."""
        if not self.drops:
            return None
        return [self.drops[r].rows if r in self.drops else self.full_rows
                for r in range(self.dp)]

    def _step_time(self, records: Iterable[Mapping[str, Any]]) -> None:
        times = [float(r["step_time_s"]) for r in records if r.get("step_time_s")]
        if times:
            self.step_time_s = statistics.median(times)
