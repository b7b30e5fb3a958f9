"""Checkpoints and failures: how often to save, what failures cost, the goodput that is left.

    rel = reliability(params=405e9, gpus=16384, cluster=cluster, step_time_s=5.0)
    rel.interval_s, rel.goodput

- Checkpoint size: fp32 master weights + two Adam moments, 12 bytes per parameter (what a
  resume needs; the bf16 copy is derived). Writing it takes size / aggregate storage write
  bandwidth. An async save blocks training only while each GPU copies its shard to host
  memory; the write must still finish before the next save starts.
- Job MTBF: 1 / the job's interruption rate, failures independent: Llama 3's rates per GPU,
  node and job by default (planner.failure_model, shared with the simulator), or a flat
  `node_failure_rate_per_day` x nodes when the cluster sets one.
- Interval: Daly (2006) "A higher order estimate of the optimum checkpoint interval for
  restart dumps", tau = sqrt(2 d M) [1 + sqrt(d / 2M) / 3 + (d / 2M) / 9] - d for d < 2M
  (else M), where d is the blocking checkpoint cost; to first order this is Young's (1974)
  sqrt(2 d M). An async save's blocking cost is tiny, so Daly alone would save every few
  steps and keep the store writing nonstop: the recommended interval is never shorter than
  the write time over the store's share for this job's checkpoints
  (`cluster.checkpoint_store_share`, 0.5), and `store_duty` reports the share it takes.
- Each failure costs its detection (a crash in about a minute, a hang when the watchdog
  fires: the failure model's mean), the wait for a spare node when one was lost
  (`cluster.node_swap_s`, for the share of failures that swap one), the restart
  (reschedule, rendezvous, restore from storage) plus the work since the last durable
  checkpoint: tau/2 on average, plus the write time when saves are async (a checkpoint
  counts only once written). Planned interruptions (Llama 3's automated maintenance, 47 in
  54 days) lose no work: a save that must be durable, then the restart.
- Goodput = (1 - d / (tau + d)) x (1 - failure share), the failure share a renewal cycle's
  (`_failure_overhead`): to first order (detect + swap + restart + lost work) / MTBF +
  planned x (write + restart) / day, less what failures while the job is already down
  would double count. The cluster simulation models the same costs event by event
  (tests/sim/test_fast_tier_agreement.py holds the two within a point).

Two levels (`two_level`): a fast tier in node memory with a replica on a peer node
survives the share `fast_tier_survivable` of failures (rate l_f) with an in-job restart;
the others (rate l_d) restore from the durable tier; the share comes from what each failure
mode leaves behind (planner.failure_model) unless the cluster sets one. Each level's interval is Daly's for
the failures that restore from it: tau_f = Daly(d_f, 1/l_f), tau_d = Daly(d_d, 1/l_d),
with d_f the host copy a snapshot blocks on, tau_f no shorter than sending a rank's shard
to its peer (the replica must land before the next snapshot) and tau_d a whole number of
fast intervals. A failure of each kind costs its detection and node swap (each kind's own
mean), its restart, its restore and half its interval plus the time until its copy is safe
(replica sent, durable write done). Goodput = (1 - d_f / (tau_f + d_f) - d_d / (tau_d +
d_d)) x (1 - the failure share of both kinds and the planned ones).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fm_pipeline.planner.cluster import ClusterConfig

CHECKPOINT_BYTES_PER_PARAM = 12


def young_interval(cost_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    if math.isinf(mtbf_s):
        return math.inf
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    x = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - cost_s


@dataclass(frozen=True)
class Reliability:
    checkpoint_gb: float
    checkpoint_write_s: float
    checkpoint_blocking_s: float
    restore_s: float
    job_mtbf_h: float
    interval_s: float
    interval_steps: int
    young_interval_s: float
    lost_work_per_failure_s: float
    restart_s: float
    checkpoint_overhead: float  # fraction of time blocked saving
    failure_overhead: float  # fraction of time lost to failures
    goodput: float
    expected_failures_per_day: float
    store_duty: float = 0.0  # share of the time the store spends writing this job's saves
    wait_per_failure_s: float = 0.0  # detection + the wait for a spare node, on average
    planned_per_day: float = 0.0  # announced interruptions: a durable save, then a restart

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                for k, v in asdict(self).items()}


def reliability(*, params: float, gpus: int, cluster: ClusterConfig, step_time_s: float,
                async_save: bool = True, interval_steps: int | None = None) -> Reliability:
    """Daly's interval and what it costs; `interval_steps` given: what that interval costs
    instead (a declared checkpoint.every_steps, critiqued against the optimum)."""
    size = params * CHECKPOINT_BYTES_PER_PARAM
    write_s = size / (cluster.storage_write_gbps * 1e9)
    blocking_s = size / gpus / (cluster.host_copy_gbps * 1e9) if async_save else write_s
    restore_s = size / (cluster.restore_gbps * 1e9)
    mix = cluster.failure_mix(gpus)
    per_day = mix.per_day
    mtbf = 86400.0 / per_day if per_day > 0 else math.inf
    if interval_steps is None:
        tau = daly_interval(blocking_s, mtbf)
        if async_save:
            # The previous save must be durable before the next starts, and saves may take
            # only their share of the store (fast storage otherwise means writing nonstop).
            tau = max(tau, write_s / cluster.checkpoint_store_share)
        tau, steps = _steps_of(max(tau, step_time_s), step_time_s)  # saves at step boundaries
        if async_save and tau < write_s / cluster.checkpoint_store_share:  # rounded below
            tau, steps = tau + step_time_s, steps + 1
    else:
        steps = max(1, interval_steps)
        tau = steps * step_time_s
        if async_save and tau < write_s:  # each save waits for the previous one's write
            blocking_s += write_s - tau
    lost = tau / 2 + (write_s if async_save else blocking_s / 2)
    restart = cluster.restart_overhead_s + restore_s
    wait = _wait_per_failure(mix, cluster, fast=None)
    ckpt_overhead = blocking_s / (tau + blocking_s) if math.isfinite(tau) else 0.0
    failure_overhead = _failure_overhead(
        [(per_day, wait + restart, lost), (mix.planned_per_day, write_s + restart, 0.0)])
    return Reliability(
        checkpoint_gb=size / 1e9, checkpoint_write_s=write_s, checkpoint_blocking_s=blocking_s,
        restore_s=restore_s, job_mtbf_h=mtbf / 3600, interval_s=tau, interval_steps=steps,
        young_interval_s=young_interval(blocking_s, mtbf), lost_work_per_failure_s=lost,
        restart_s=restart, checkpoint_overhead=ckpt_overhead, failure_overhead=failure_overhead,
        goodput=(1 - ckpt_overhead) * (1 - failure_overhead),
        expected_failures_per_day=per_day,
        store_duty=min(1.0, write_s / tau) if math.isfinite(tau) and tau > 0 else 0.0,
        wait_per_failure_s=wait, planned_per_day=mix.planned_per_day,
    )


def _wait_per_failure(mix, cluster: ClusterConfig, *, fast: bool | None) -> float:
    """Mean detection + node swap of the fast-survivable failures (fast=True), the others
    (False) or all of them (None)."""
    def of(i: int) -> float:
        return mix.detect_s[i] + mix.swap_share[i] * cluster.node_swap_s
    if fast is None:
        return mix.fast_share * of(0) + (1 - mix.fast_share) * of(1)
    return of(0 if fast else 1)


def _failure_overhead(kinds: list[tuple[float, float, float]]) -> float:
    """The share of the time failures take, from (per day, down s, work lost s) per kind: a
    renewal cycle (the job runs, fails, is down, restarts). Work is lost only while it runs
    and a failure while the job is already down costs nothing more, so per second running
    the job loses sum(rate x lost) of work and adds sum(rate x down) of wall clock:
    1 - (1 - sum r L) / (1 + sum r D). To first order that is sum r (D + L), the classic
    (restart + lost) / MTBF, which overcounts once failures come every few hours."""
    kinds = [k for k in kinds if k[0] > 0]  # none of a kind: its (infinite) interval is moot
    lost = sum(per_day / 86400.0 * lost_s for per_day, _, lost_s in kinds)
    down = sum(per_day / 86400.0 * down_s for per_day, down_s, _ in kinds)
    return min(1.0, max(0.0, 1 - (1 - lost) / (1 + down)))


@dataclass(frozen=True)
class TwoLevel:
    """Fast (memory + peer replica) and durable intervals, and what each level costs."""

    fast_interval_s: float
    fast_interval_steps: int
    durable_interval_s: float
    durable_interval_steps: int
    fast_blocking_s: float
    replica_s: float  # one rank's shard to its peer node
    fast_restore_s: float
    fast_failures_per_day: float
    durable_failures_per_day: float
    lost_per_fast_failure_s: float
    lost_per_durable_failure_s: float
    checkpoint_overhead: float
    failure_overhead: float
    goodput: float
    goodput_durable_only: float

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                for k, v in asdict(self).items()}


def _steps_of(tau: float, step_time_s: float) -> tuple[float, int]:
    """An interval rounded to whole steps (at least one), and the steps; inf stays inf."""
    if not math.isfinite(tau):
        return tau, 0
    steps = max(1, round(tau / step_time_s))
    return steps * step_time_s, steps


def two_level(*, params: float, gpus: int, cluster: ClusterConfig, step_time_s: float,
              durable: Reliability | None = None) -> TwoLevel:
    """The multi-level Young/Daly plan (module docstring) next to the durable-only one."""
    durable = durable or reliability(params=params, gpus=gpus, cluster=cluster,
                                     step_time_s=step_time_s)
    nodes = max(1, -(-gpus // cluster.gpus_per_node))
    shard = params * CHECKPOINT_BYTES_PER_PARAM / gpus
    blocking_f = shard / (cluster.host_copy_gbps * 1e9)
    replica_s = shard / (cluster.inter_node_gbps * 1e9) if nodes > 1 else 0.0
    fast_restore = shard / (cluster.host_copy_gbps * 1e9)
    mix = cluster.failure_mix(gpus)
    rate = mix.per_day / 86400.0
    s = mix.fast_share if nodes > 1 else 0.0  # no peer: nothing survives a node
    rate_f, rate_d = rate * s, rate * (1 - s)
    tau_f = daly_interval(blocking_f, 1 / rate_f) if rate_f > 0 else math.inf
    tau_f, steps_f = _steps_of(max(tau_f, replica_s, step_time_s), step_time_s)
    tau_d = daly_interval(durable.checkpoint_blocking_s, 1 / rate_d) if rate_d > 0 \
        else math.inf
    tau_d = max(tau_d, durable.checkpoint_write_s / cluster.checkpoint_store_share, step_time_s)
    if math.isfinite(tau_d) and math.isfinite(tau_f):
        tau_d = max(1, round(tau_d / tau_f)) * tau_f  # durable saves on fast boundaries
    tau_d, steps_d = _steps_of(tau_d, step_time_s)
    down_f = _wait_per_failure(mix, cluster, fast=True) + cluster.inplace_restart_s + fast_restore
    down_d = _wait_per_failure(mix, cluster, fast=False if s > 0 else None) + durable.restart_s
    work_f = tau_f / 2 + replica_s
    work_d = tau_d / 2 + durable.checkpoint_write_s
    lost_f, lost_d = down_f + work_f, down_d + work_d
    ckpt = 0.0
    if math.isfinite(tau_f):
        ckpt += blocking_f / (tau_f + blocking_f)
    if math.isfinite(tau_d):
        ckpt += durable.checkpoint_blocking_s / (tau_d + durable.checkpoint_blocking_s)
    failure = _failure_overhead(
        [(rate_f * 86400, down_f, work_f), (rate_d * 86400, down_d, work_d),
         (mix.planned_per_day, durable.checkpoint_write_s + durable.restart_s, 0.0)])
    return TwoLevel(
        fast_interval_s=tau_f, fast_interval_steps=steps_f, durable_interval_s=tau_d,
        durable_interval_steps=steps_d, fast_blocking_s=blocking_f, replica_s=replica_s,
        fast_restore_s=fast_restore, fast_failures_per_day=rate_f * 86400,
        durable_failures_per_day=rate_d * 86400, lost_per_fast_failure_s=lost_f,
        lost_per_durable_failure_s=lost_d, checkpoint_overhead=ckpt,
        failure_overhead=failure, goodput=(1 - ckpt) * (1 - failure),
        goodput_durable_only=durable.goodput)
