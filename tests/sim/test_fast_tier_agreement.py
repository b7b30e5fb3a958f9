"""The planner's goodput and the cluster simulation's ETTR for the same job agree within a
point, with the fast tier and without it, at three job sizes: one failure model (Llama 3's
rates, what each failure leaves behind, how long it takes to notice), the same intervals,
the same restart, swap and restore costs; the planner in expectation, the simulator event
by event over 54 days."""

from __future__ import annotations

import statistics

import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.reliability import reliability, two_level
from fm_pipeline.sim.config import CheckpointPolicy, FastTierPolicy, RecoveryPolicy, SimConfig
from fm_pipeline.sim.single_job import simulate_job

H100 = make_cluster("h100")  # Llama 3's failures per GPU, node and job; 10 GB/s storage
PARAMS, STEP_S = 405e9, 9.0


def _ettr(cfg: SimConfig) -> float:
    return statistics.median(simulate_job(cfg.with_(seed=s)).ettr for s in range(4))


@pytest.mark.parametrize("gpus", [1024, 4096, 16384])
def test_the_planner_and_the_simulator_agree_on_goodput_with_and_without_the_fast_tier(gpus):
    durable = reliability(params=PARAMS, gpus=gpus, cluster=H100, step_time_s=STEP_S)
    fast = two_level(params=PARAMS, gpus=gpus, cluster=H100, step_time_s=STEP_S,
                     durable=durable)
    # The planner assumes a spare is there when a node is lost: plenty of them.
    base = SimConfig(n_gpus=gpus, horizon_days=54.0, recovery=RecoveryPolicy(
        restart_s=H100.restart_overhead_s, hot_spares=gpus, spare_swap_s=H100.node_swap_s))
    assert base.mtbf_s() / 3600 == pytest.approx(durable.job_mtbf_h)  # the same failures

    def saves(interval_s: float) -> CheckpointPolicy:
        return CheckpointPolicy(interval_s=interval_s,
                                save_blocking_s=durable.checkpoint_blocking_s,
                                persist_s=durable.checkpoint_write_s, load_s=durable.restore_s)

    durable_only = _ettr(base.with_(checkpoint=saves(durable.interval_s)))
    with_fast = _ettr(base.with_(
        checkpoint=saves(fast.durable_interval_s),
        fast_tier=FastTierPolicy(interval_s=fast.fast_interval_s,
                                 restart_s=H100.inplace_restart_s, load_s=fast.fast_restore_s)))
    assert durable.goodput == pytest.approx(durable_only, abs=0.01)
    assert fast.goodput == pytest.approx(with_fast, abs=0.01)
    assert with_fast > durable_only  # and the fast tier is worth something at every size
