"""Checkpoints and failures: how often to save, what failures cost, the goodput that is left.

    rel = reliability(params=405e9, gpus=16384, cluster=cluster, step_time_s=5.0)
    rel.interval_s, rel.goodput

- Checkpoint size: fp32 master weights + two Adam moments, 12 bytes per parameter (what a
  resume needs; the bf16 copy is derived). Writing it takes size / aggregate storage write
  bandwidth. An async save blocks training only while each GPU copies its shard to host
  memory; the write must still finish before the next save starts.
- Job MTBF: 1 / (nodes x node failure rate), failures independent.
- Interval: Daly (2006) "A higher order estimate of the optimum checkpoint interval for
  restart dumps", tau = sqrt(2 d M) [1 + sqrt(d / 2M) / 3 + (d / 2M) / 9] - d for d < 2M
  (else M), where d is the blocking checkpoint cost; to first order this is Young's (1974)
  sqrt(2 d M).
- Each failure costs the restart (reschedule, rendezvous, restore from storage) plus the
  work since the last durable checkpoint: tau/2 on average, plus the write time when saves
  are async (a checkpoint counts only once written).
- Goodput = (1 - d / (tau + d)) x (1 - (restart + lost work) / MTBF).
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


def job_mtbf_s(*, nodes: int, node_failure_rate_per_day: float) -> float:
    if node_failure_rate_per_day <= 0:
        return math.inf
    return 86400.0 / (nodes * node_failure_rate_per_day)


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

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                for k, v in asdict(self).items()}


def reliability(*, params: float, gpus: int, cluster: ClusterConfig, step_time_s: float,
                async_save: bool = True) -> Reliability:
    nodes = max(1, -(-gpus // cluster.gpus_per_node))
    size = params * CHECKPOINT_BYTES_PER_PARAM
    write_s = size / (cluster.storage_write_gbps * 1e9)
    blocking_s = size / gpus / (cluster.host_copy_gbps * 1e9) if async_save else write_s
    restore_s = size / (cluster.restore_gbps * 1e9)
    mtbf = job_mtbf_s(nodes=nodes, node_failure_rate_per_day=cluster.node_failure_rate_per_day)
    tau = daly_interval(blocking_s, mtbf)
    if async_save:
        tau = max(tau, write_s)  # the previous save must be durable before the next starts
    tau = max(tau, step_time_s)  # saves happen at step boundaries
    steps = max(1, round(tau / step_time_s)) if math.isfinite(tau) else 0
    if math.isfinite(tau):
        tau = steps * step_time_s
    lost = tau / 2 + (write_s if async_save else blocking_s / 2)
    restart = cluster.restart_overhead_s + restore_s
    ckpt_overhead = blocking_s / (tau + blocking_s) if math.isfinite(tau) else 0.0
    failure_overhead = min(1.0, (restart + lost) / mtbf) if math.isfinite(mtbf) else 0.0
    return Reliability(
        checkpoint_gb=size / 1e9, checkpoint_write_s=write_s, checkpoint_blocking_s=blocking_s,
        restore_s=restore_s, job_mtbf_h=mtbf / 3600, interval_s=tau, interval_steps=steps,
        young_interval_s=young_interval(blocking_s, mtbf), lost_work_per_failure_s=lost,
        restart_s=restart, checkpoint_overhead=ckpt_overhead, failure_overhead=failure_overhead,
        goodput=(1 - ckpt_overhead) * (1 - failure_overhead),
        expected_failures_per_day=nodes * cluster.node_failure_rate_per_day,
    )
