"""Checkpoint interval (Young/Daly), MTBF, goodput, time and cost."""

from __future__ import annotations

import math

import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.cost import training_cost
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.reliability import daly_interval, reliability, young_interval


def test_young_interval_is_sqrt_2_delta_m():
    assert young_interval(60, 86400) == pytest.approx(math.sqrt(2 * 60 * 86400))


def test_daly_matches_his_higher_order_formula_and_tends_to_young():
    d, m = 300.0, 3600.0
    x = d / (2 * m)
    assert daly_interval(d, m) == pytest.approx(
        math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d
    )
    assert daly_interval(1.0, 1e7) == pytest.approx(young_interval(1.0, 1e7), rel=1e-3)
    assert (
        daly_interval(5000, 2000) == 2000
    )  # checkpointing costs more than 2 MTBFs: save once per M


def test_job_failures_grow_with_the_job_flat_or_per_component():
    flat = make_cluster("h100", node_failure_rate_per_day=0.01)
    assert flat.failures_per_day(8) == pytest.approx(0.01)
    assert flat.failures_per_day(2048 * 8) == pytest.approx(20.48)
    assert make_cluster("h100", node_failure_rate_per_day=0).failures_per_day(64) == 0
    llama3 = make_cluster("h100")  # Table 5: 419 in 54 days at 16,384 GPUs, 1/day of it per job
    assert llama3.failures_per_day(16384) == pytest.approx(419 / 54)
    assert 1.0 < llama3.failures_per_day(8) < 1.1  # software bugs do not shrink with the job
    zero = reliability(params=8e9, gpus=64, step_time_s=1.0,
                       cluster=make_cluster("h100", node_failure_rate_per_day=0))
    assert math.isinf(zero.job_mtbf_h)


def test_llama3_failure_rate_gives_hours_of_mtbf_and_over_90_percent_goodput():
    # Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048 nodes) and
    # "higher than 90% effective training time"; Tectonic sustains 2 TB/s of writes.
    rate = 419 / 54 / 2048
    cluster = make_cluster("h100", node_failure_rate_per_day=rate, storage_write_gbps=2000)
    rel = reliability(params=405e9, gpus=16384, cluster=cluster, step_time_s=6.0)
    assert rel.job_mtbf_h == pytest.approx(54 * 24 / 419, rel=1e-6)
    assert rel.expected_failures_per_day == pytest.approx(419 / 54)
    assert 0.9 < rel.goodput < 0.97
    assert rel.checkpoint_gb == pytest.approx(405e9 * 12 / 1e9)


def test_more_failures_mean_shorter_intervals_and_less_goodput():
    base = dict(params=70e9, gpus=1024, step_time_s=2.0)
    calm = reliability(cluster=make_cluster("h100", node_failure_rate_per_day=0.001), **base)
    busy = reliability(cluster=make_cluster("h100", node_failure_rate_per_day=0.01), **base)
    assert busy.interval_s < calm.interval_s and busy.goodput < calm.goodput


def test_sync_checkpoints_block_on_storage_and_async_ones_on_the_host_copy():
    cluster = make_cluster("h100", storage_write_gbps=10, node_failure_rate_per_day=0.005)
    sync = reliability(params=70e9, gpus=1024, cluster=cluster, step_time_s=2.0, async_save=False)
    quick = reliability(params=70e9, gpus=1024, cluster=cluster, step_time_s=2.0, async_save=True)
    assert sync.checkpoint_blocking_s == pytest.approx(70e9 * 12 / 10e9)
    assert quick.checkpoint_blocking_s < sync.checkpoint_blocking_s / 1000
    assert quick.interval_s >= quick.checkpoint_write_s  # a save must land before the next starts
    assert quick.goodput > sync.goodput


def test_cost_is_gpu_hours_times_price_plus_checkpoint_storage():
    cluster = make_cluster("h100", dollars_per_gpu_hour=2.0, node_failure_rate_per_day=0.0)
    rel = reliability(params=8e9, gpus=64, cluster=cluster, step_time_s=1.0)
    cost = training_cost(
        training_tokens=1e12,
        tokens_per_step=2**20,
        step_time_s=1.0,
        gpus=64,
        cluster=cluster,
        reliability=rel,
    )
    steps = math.ceil(1e12 / 2**20)
    assert cost.steps == steps
    assert cost.gpu_hours == pytest.approx(64 * steps / 3600 / rel.goodput)
    assert cost.dollars == pytest.approx(cost.gpu_hours * 2.0 + cost.checkpoint_storage_dollars)
    assert cost.dollars_per_million_tokens == pytest.approx(cost.dollars / 1e6)


def _two(rate=0.005, gpus=16384, **cluster):
    from fm_pipeline.planner.reliability import two_level

    c = make_cluster("h100", node_failure_rate_per_day=rate, **cluster)
    return two_level(params=405e9, gpus=gpus, cluster=c, step_time_s=9.0)


def test_the_fast_tier_shortens_the_loss_per_failure_and_raises_goodput():
    plan = _two()
    assert plan.goodput > plan.goodput_durable_only
    assert plan.lost_per_fast_failure_s < plan.lost_per_durable_failure_s / 5
    assert plan.fast_interval_steps < plan.durable_interval_steps
    # Durable saves land on fast boundaries.
    assert plan.durable_interval_steps % plan.fast_interval_steps == 0
    # The split of failures: what each of Llama 3's 419 leaves behind, at its own size
    # 357 survivable (all but software bugs, dependencies and silent data corruption).
    total = plan.fast_failures_per_day + plan.durable_failures_per_day
    assert plan.fast_failures_per_day == pytest.approx(357 / 419 * total)
    assert _two(fast_tier_survivable=0.5).fast_failures_per_day == pytest.approx(0.5 * total)


def test_more_failures_mean_shorter_fast_intervals_and_a_larger_gain():
    calm, busy = _two(rate=0.001), _two(rate=0.02)
    assert busy.fast_interval_s < calm.fast_interval_s
    assert busy.goodput - busy.goodput_durable_only > calm.goodput - calm.goodput_durable_only


def test_without_a_peer_node_or_a_survivable_share_there_is_no_fast_interval():
    for plan in (_two(gpus=8), _two(fast_tier_survivable=0.0)):
        assert plan.fast_failures_per_day == 0 and plan.fast_interval_steps == 0
        assert plan.to_dict()["fast_interval_s"] is None  # infinite, as JSON says it
        assert plan.goodput == pytest.approx(plan.goodput_durable_only, rel=0.02)


def test_a_survivable_share_outside_0_1_is_refused_naming_it():
    from fm_pipeline.planner.errors import PlanInputError

    with pytest.raises(PlanInputError, match="fast_tier_survivable"):
        make_cluster("h100", fast_tier_survivable=1.5)


def test_async_saves_leave_the_store_room_for_everything_else():
    """Async saves block for a host copy only, so Daly alone would checkpoint as often as
    the store can write (writing nonstop); the interval keeps the store's share instead."""
    params, gpus, step = 100e9, 2048, 5.0
    shared = reliability(params=params, gpus=gpus, cluster=make_cluster("h100"),
                         step_time_s=step)
    assert shared.checkpoint_write_s == pytest.approx(params * 12 / 10e9)  # 120 s at 10 GB/s
    assert shared.interval_s >= 2 * shared.checkpoint_write_s  # share 0.5
    assert shared.store_duty <= 0.5
    whole = reliability(params=params, gpus=gpus, step_time_s=step,
                        cluster=make_cluster("h100", checkpoint_store_share=1.0))
    assert whole.interval_s < shared.interval_s and whole.store_duty > 0.9
    # A store fast enough that Daly's own optimum is longer: the share does not bind.
    fast = reliability(params=params, gpus=gpus, step_time_s=step,
                       cluster=make_cluster("h100", storage_write_gbps=2000.0))
    assert fast.interval_s > 2 * fast.checkpoint_write_s and fast.store_duty < 0.5
    with pytest.raises(PlanInputError, match="checkpoint_store_share"):
        make_cluster("h100", checkpoint_store_share=0.0)


def test_no_failures_at_all_cost_nothing_and_need_no_interval():
    from fm_pipeline.planner.reliability import reliability, two_level

    c = make_cluster("h100", node_failure_rate_per_day=0.0)
    rel = reliability(params=7e9, gpus=64, cluster=c, step_time_s=1.0)
    assert rel.failure_overhead == 0.0 and rel.goodput > 0.999
    assert two_level(params=7e9, gpus=64, cluster=c, step_time_s=1.0).failure_overhead == 0.0
