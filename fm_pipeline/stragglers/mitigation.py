"""Straggler mitigation: which rank slots and hosts a job no longer uses, and the launch
that follows from it.

    plan = plan_after_stragglers(job)                       # local: fewer ranks
    SegmentLaunch(plan.job, end_step=...)                   # resumes resharded from the
                                                            # checkpoint the stop committed
    plan = plan_after_stragglers(job, target="kubernetes")  # same size, other nodes
    KubernetesTarget(..., placement=avoiding(placement, plan.avoid_hosts))

Exclusions come from the job's event log: every "straggler" record with action "exclude"
(written by rank 0 when resilience.straggler_policy is "exclude"), until an
"exclusions_cleared" record or resilience.exclusion_ttl_s later. At most
resilience.max_straggler_stops segments are stopped for stragglers (straggler_stops); past
that the watch reports only and says so. Excluding keeps tp, pp and dp_replicate and
shrinks dp_shard (the global batch stays the same; the checkpoint is resharded on restore):
  local       one machine cannot swap in a new host, so the slot is dropped: the largest
              world size <= world - excluded that the layout and batch accept. On GPUs the
              remaining slots' devices are named in CUDA_VISIBLE_DEVICES; on CPU a slot is
              only a process, so dropping one frees a share of the cores.
  kubernetes  same world size on replacement nodes: the flagged hosts go to the next
              JobSet's node anti-affinity (Placement.avoid_hosts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from fm_pipeline.config import JobSpec, dump_job, parse_job
from fm_pipeline.rundir.events import read_events


@dataclass(frozen=True)
class ExcludedSlot:
    host: str
    local_rank: int
    rank: int  # global rank when it was flagged
    reason: str
    time: float


@dataclass(frozen=True)
class ExclusionPlan:
    job: JobSpec  # what to launch next (unchanged when nothing is excluded)
    excluded: tuple[ExcludedSlot, ...]
    avoid_hosts: tuple[str, ...]  # Kubernetes node anti-affinity for the next JobSet
    env: dict[str, str] = field(default_factory=dict)  # local GPU slots left
    note: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.excluded)


def _since_cleared(runs: Path) -> list[dict]:
    records, _ = read_events(runs, kinds=("straggler", "exclusions_cleared"))
    last = max((i for i, r in enumerate(records) if r["kind"] == "exclusions_cleared"),
               default=-1)
    return records[last + 1:]


def straggler_stops(runs: Path) -> int:
    """Segments the `exclude` policy stopped since the exclusions were last cleared (from the
    job's run directory `runs`)."""
    return len({r.get("segment") for r in _since_cleared(runs)
                if r.get("action") == "exclude"})


def excluded_slots(runs: Path, *, ttl_s: float | None = None,
                   now: float | None = None) -> list[ExcludedSlot]:
    """Slots the job's straggler policy excluded, since the last clearing and (with
    `ttl_s`) less than ttl_s ago, oldest first."""
    now = time.time() if now is None else now
    slots: dict[tuple[str, int], ExcludedSlot] = {}
    for r in _since_cleared(runs):
        if ttl_s is not None and now - float(r.get("time", 0.0)) > ttl_s:
            continue  # expired: the slot or host may be used again
        if r.get("action") == "exclude":
            key = (str(r.get("host")), int(r.get("local_rank", r.get("rank", 0))))
            slots.setdefault(key, ExcludedSlot(
                host=key[0], local_rank=key[1], rank=int(r.get("rank", -1)),
                reason=f"{r.get('section')} +{100 * float(r.get('severity', 0)):.0f}% from "
                       f"step {r.get('first_step')}",
                time=float(r.get("time", 0.0))))
    return list(slots.values())


def shrunk_world(job: JobSpec, ranks_left: int) -> JobSpec | None:
    """The job at the largest world size <= ranks_left its layout and batch accept (dp_shard
    shrinks), or None. Multi-node jobs lose whole nodes."""
    p = job.parallelism
    per_node = p.nproc_per_node
    for world in range(ranks_left, 0, -1):
        if p.nnodes > 1 and world % per_node:
            continue
        nnodes, nproc = (world // per_node, per_node) if p.nnodes > 1 else (1, world)
        spec = dump_job(job)
        spec["parallelism"].update(nnodes=nnodes, nproc_per_node=nproc, dp_shard=-1)
        try:
            return parse_job(spec, source=f"<{job.name} at world size {world}>")
        except ValueError:
            continue
    return None


def exclusion_refusal(job: JobSpec, n_excluded: int = 1) -> str | None:
    """Why excluding `n_excluded` slots locally is impossible, or None when it is possible."""
    world = job.parallelism.world_size
    if world - n_excluded < 1:
        return f"excluding {n_excluded} of {world} ranks leaves none"
    if shrunk_world(job, world - n_excluded) is None:
        p = job.parallelism
        return (f"no smaller layout keeps tp {p.tp} x pp {p.pp} x dp_replicate "
                f"{p.dp_replicate} with global_batch_size {job.training.global_batch_size}")
    return None


def plan_after_stragglers(job: JobSpec, runs: Path, *,
                          target: Literal["local", "kubernetes"] = "local") -> ExclusionPlan:
    """The next launch of `job` given its exclusions in its run directory `runs` (see the
    module docstring)."""
    if target not in ("local", "kubernetes"):
        raise ValueError(f"target must be 'local' or 'kubernetes', got {target!r}")
    excluded = tuple(excluded_slots(runs, ttl_s=job.resilience.exclusion_ttl_s))
    hosts = tuple(sorted({s.host for s in excluded}))
    if not excluded:
        return ExclusionPlan(job=job, excluded=(), avoid_hosts=())
    if target == "kubernetes":
        return ExclusionPlan(job=job, excluded=excluded, avoid_hosts=hosts,
                             note=f"same {job.parallelism.nnodes} nodes, avoiding "
                                  f"{', '.join(hosts)}")
    p = job.parallelism
    gone = len({s.host for s in excluded}) * p.nproc_per_node if p.nnodes > 1 else len(excluded)
    smaller = shrunk_world(job, p.world_size - gone)
    if smaller is None:
        raise ValueError(f"job {job.name}: {exclusion_refusal(job, gone)}; clear the "
                         "exclusions (fm chaos clear-exclusions) or change the layout")
    env = {}
    if job.cluster.accelerator.lower() != "cpu" and p.nnodes == 1:
        left = [i for i in range(p.nproc_per_node)
                if i not in {s.local_rank for s in excluded}]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, left[:smaller.parallelism.world_size]))
    sp = smaller.parallelism
    return ExclusionPlan(job=smaller, excluded=excluded, avoid_hosts=hosts, env=env,
                         note=f"world size {p.world_size} -> {sp.world_size} (dp_shard "
                              f"{p.resolved_dp_shard} -> {sp.resolved_dp_shard}) without "
                              + ", ".join(f"{s.host}/local rank {s.local_rank}"
                                          for s in excluded))


def avoiding(placement, hosts: tuple[str, ...]):
    """`placement` (fm_pipeline.launch.Placement) that also avoids `hosts`."""
    merged = tuple(sorted({*placement.avoid_hosts, *hosts}))
    return replace(placement, avoid_hosts=merged)
