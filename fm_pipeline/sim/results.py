"""What a simulated job reports: ETTR, goodput, lost GPU-hours by cause, interruptions.

Definitions (as in Meta's "Revisiting Reliability in Large-Scale ML Research Clusters"
and the Llama 3 paper's "effective training time"):
- ETTR = time spent on training progress that was kept / wall-clock time of the job.
  Recomputed work, detection, node swaps, relaunch + restore, checkpoint stalls and
  straggler slowdown are not effective training time.
- goodput = productive GPU-hours / GPU-hours paid for (the job's GPUs plus idle hot
  spares): hot spares raise ETTR but cost goodput.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

BUCKETS = ("lost_work", "detection", "replacement", "restart", "checkpoint", "stragglers")


@dataclass(frozen=True)
class SimResult:
    name: str
    seed: int
    n_gpus: int
    wall_hours: float
    ettr: float
    goodput: float
    productive_gpu_hours: float
    total_gpu_hours: float  # the job's GPUs x wall clock
    spare_gpu_hours: float  # hot spares held idle
    lost_gpu_hours: dict[str, float]  # by bucket (BUCKETS)
    lost_by_category: dict[str, float]  # by root-cause category (gpu, host, network, ...)
    interruptions: int  # unplanned interruptions of the job
    planned_interruptions: int
    interruptions_by_mode: dict[str, int]
    component_failures: int  # every fault, also those hitting a job already down
    restarts: int
    checkpoints: int
    stragglers: int
    stragglers_detected: int
    stragglers_excluded: int
    spare_swaps: int
    cold_replacements: int
    mtbi_hours: float  # mean time between unplanned interruptions
    events_simulated: int
    timeline: list[tuple[float, float]] = field(repr=False)  # (wall hours, progress hours)
    in_job_restarts: int = 0  # restarts the fast tier served (in-job, from memory)

    @classmethod
    def build(cls, cfg, *, productive_gpu_s: float, lost_gpu_s: dict[tuple[str, str], float],
              interruptions: dict[str, int], component_failures: dict[str, int],
              counts: dict[str, int], timeline: list[tuple[float, float]],
              events_simulated: int) -> "SimResult":
        wall_h = cfg.horizon_s / 3600
        total = cfg.n_gpus * wall_h
        spare = cfg.recovery.hot_spares * cfg.gpus_per_node * wall_h
        by_bucket: dict[str, float] = {b: 0.0 for b in BUCKETS}
        by_category: dict[str, float] = defaultdict(float)
        for (bucket, category), gpu_s in lost_gpu_s.items():
            by_bucket[bucket] += gpu_s / 3600
            if bucket not in ("checkpoint", "stragglers"):
                by_category[category] += gpu_s / 3600
        planned_names = {m.name for m in cfg.failure_modes if m.planned}
        unplanned = sum(n for name, n in interruptions.items() if name not in planned_names)
        planned = sum(n for name, n in interruptions.items() if name in planned_names)
        productive_h = productive_gpu_s / 3600
        return cls(
            name=cfg.name,
            seed=cfg.seed,
            n_gpus=cfg.n_gpus,
            wall_hours=wall_h,
            ettr=productive_h / total,
            goodput=productive_h / (total + spare),
            productive_gpu_hours=productive_h,
            total_gpu_hours=total,
            spare_gpu_hours=spare,
            lost_gpu_hours=by_bucket,
            lost_by_category=dict(sorted(by_category.items(), key=lambda kv: -kv[1])),
            interruptions=unplanned,
            planned_interruptions=planned,
            interruptions_by_mode=dict(sorted(interruptions.items(), key=lambda kv: -kv[1])),
            component_failures=sum(component_failures.values()),
            restarts=counts.get("restarts", 0),
            checkpoints=counts.get("checkpoints", 0),
            stragglers=counts.get("stragglers", 0),
            stragglers_detected=counts.get("stragglers_detected", 0),
            stragglers_excluded=counts.get("stragglers_excluded", 0),
            spare_swaps=counts.get("spare_swaps", 0),
            cold_replacements=counts.get("cold_replacements", 0),
            mtbi_hours=wall_h / unplanned if unplanned else float("inf"),
            events_simulated=events_simulated,
            timeline=[(t / 3600, w / 3600) for t, w in timeline],
            in_job_restarts=counts.get("in_job_restarts", 0),
        )

    @property
    def lost_total_gpu_hours(self) -> float:
        return sum(self.lost_gpu_hours.values())

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "timeline"}
        if timeline:
            out["timeline"] = self.timeline
        return out
