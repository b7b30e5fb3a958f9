"""Job traces for the multi-tenant simulation: a file format, a generator, cluster tenants.

    from fm_pipeline.sim.trace import cluster_tenants, load_trace, synthetic_trace
    tenants = cluster_tenants(pool_gpus=4096)
    trace = synthetic_trace(tenants, n_jobs=400, seed=0, load=0.9)
    trace = load_trace("jobs.jsonl")   # {"job_id", "tenant", "gpus", "priority", "submit_s", "duration_s"}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np

from fm_pipeline.scheduling import TenantsConfig
from fm_pipeline.scheduling.tenants import parse_tenants, priority_values


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: who, how many GPUs, how urgent, when, and how much work."""

    job_id: str
    tenant: str
    gpus: int
    priority: int
    submit_s: float
    duration_s: float  # run time at full speed, without startup or preemptions

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.submit_s < 0 or not self.duration_s > 0:
            raise ValueError(
                f"trace job {self.job_id}: needs gpus >= 1, submit_s >= 0, duration_s > 0 "
                f"(got {self.gpus}, {self.submit_s}, {self.duration_s})"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, line: int | None = None) -> "TraceJob":
        where = f"trace line {line}" if line is not None else "trace job"
        missing = [k for k in ("job_id", "tenant", "gpus", "submit_s", "duration_s") if k not in d]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(missing)}")
        priority = d.get("priority", "normal")
        if isinstance(priority, str):
            classes = priority_values()
            if priority not in classes:
                raise ValueError(f"{where}: unknown priority {priority!r}; known: {', '.join(classes)}")
            priority = classes[priority]
        try:
            return cls(str(d["job_id"]), str(d["tenant"]), int(d["gpus"]), int(priority),
                       float(d["submit_s"]), float(d["duration_s"]))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def load_trace(path: str | Path) -> list[TraceJob]:
    """A JSON-lines trace: one {"job_id", "tenant", "gpus", "priority", "submit_s",
    "duration_s"} per line (priority: an int or a class name: low, normal, high, urgent)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace {path} does not exist")
    jobs = []
    for i, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"trace line {i}: not JSON ({e.msg})") from None
        jobs.append(TraceJob.from_dict(record, line=i))
    if not jobs:
        raise ValueError(f"trace {path} holds no jobs")
    return jobs


def cluster_tenants(*, pool_gpus: int = 4096, max_preemptions_per_hour: int = 2,
                    grace_s: float = 120.0) -> TenantsConfig:
    """A cluster-sized version of configs/tenants.yaml: prod (50% quota, weight 2),
    research (30%), eval (no quota, may borrow up to 25%); 20% shared."""
    return parse_tenants(
        {
            "pool": {"gpu": pool_gpus},
            "tenants": [
                {"name": "research", "weight": 1, "quota": {"gpu": int(0.3 * pool_gpus)},
                 "priorities": ["low", "normal"]},
                {"name": "prod", "weight": 2, "quota": {"gpu": int(0.5 * pool_gpus)},
                 "priorities": ["low", "normal", "high", "urgent"]},
                {"name": "eval", "weight": 1, "quota": {"gpu": 0},
                 "borrowing_limit": {"gpu": int(0.25 * pool_gpus)}, "priorities": ["low", "normal"]},
            ],
            "preemption": {"max_per_job_per_hour": max_preemptions_per_hour, "grace_s": grace_s},
        },
        source="cluster_tenants()",
    )


def synthetic_trace(config: TenantsConfig, *, n_jobs: int = 400, seed: int = 0,
                    load: float = 0.9, median_duration_s: float = 4 * 3600.0) -> list[TraceJob]:
    """Poisson arrivals sized so the offered load is about `load` x the pool.

    Sizes are powers of two of 8-GPU nodes, most jobs small (most jobs in research clusters
    are small, most GPU-hours go to large ones); durations lognormal around
    `median_duration_s`; tenants in proportion to quota (eval: a small share); priorities
    mostly normal, some low and, where allowed, high.
    """
    if n_jobs < 1 or not 0 < load:
        raise ValueError(f"need n_jobs >= 1 and load > 0, got {n_jobs}, {load}")
    rng = np.random.default_rng(seed)
    pool = config.pool["gpu"]
    names = config.tenant_names
    share = np.array([max(config.tenant(n).quota.get("gpu", 0), 0.1 * pool) for n in names], float)
    share /= share.sum()
    max_exp = max(0, int(math.log2(max(pool // 16, 1))))  # the biggest job: half the pool
    classes = priority_values()
    jobs, sizes, durations, tenants, prios = [], [], [], [], []
    for i in range(n_jobs):
        k = min(int(rng.geometric(0.45)) - 1, max_exp)
        durations.append(float(median_duration_s * rng.lognormal(0.0, 1.0)))
        t = names[int(rng.choice(len(names), p=share))]
        tenants.append(t)
        sizes.append(min(8 * 2**k, pool, _largest_job(config, t)))
        allowed = config.tenant(t).priorities
        weights = np.array([{"low": 0.2, "normal": 0.7, "high": 0.1, "urgent": 0.0}[p] for p in allowed])
        weights = weights / weights.sum() if weights.sum() else np.full(len(allowed), 1 / len(allowed))
        prios.append(classes[allowed[int(rng.choice(len(allowed), p=weights))]])
    mean_gpu_s = fmean(s * d for s, d in zip(sizes, durations))
    interarrival = mean_gpu_s / (load * pool)
    t = 0.0
    for i in range(n_jobs):
        t += float(rng.exponential(interarrival))
        jobs.append(TraceJob(f"job-{i:05d}", tenants[i], sizes[i], prios[i], t, durations[i]))
    return jobs


def _largest_job(config: TenantsConfig, tenant: str) -> int:
    """The most GPUs one job of the tenant may hold (quota + borrowing limit, or the pool)."""
    spec = config.tenant(tenant)
    if spec.borrowing_limit is None or "gpu" not in spec.borrowing_limit:
        return config.pool["gpu"]
    return spec.quota.get("gpu", 0) + spec.borrowing_limit["gpu"]
