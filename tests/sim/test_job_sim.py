"""The single-job cluster simulation: rates honoured, GPU-hours conserved, and the
trade-offs an operator tunes (checkpoint interval, hot spares, failure rate) behave."""

from __future__ import annotations

import math

import pytest

from fm_pipeline.sim import (
    CheckpointPolicy,
    RecoveryPolicy,
    SimConfig,
    StragglerModel,
    llama3_405b,
    simulate_job,
    single_mode,
)
from fm_pipeline.sim.single_job import _JobSim
from fm_pipeline.sim.sweep import (
    sweep_checkpoint_interval,
    sweep_failure_rate,
    young_daly_interval_s,
)


def test_component_failures_match_the_configured_rates_over_a_long_run():
    # Five times the published snapshot, with cheap (rare) checkpoints to run fast.
    cfg = llama3_405b(horizon_days=270.0, seed=7)
    cfg = cfg.with_(checkpoint=cfg.checkpoint.with_(interval_s=3600.0))
    sim = _JobSim(cfg)
    result = sim.run()
    hours = cfg.horizon_s / 3600
    expected = {
        m.name: m.expected_count(n_gpus=cfg.n_gpus, gpus_per_node=cfg.gpus_per_node, hours=hours)
        for m in cfg.failure_modes
    }
    total = sum(expected.values())  # ~2,330
    assert abs(result.component_failures - total) < 4 * math.sqrt(total)
    # The biggest root causes one by one (Poisson: 4 standard deviations).
    for name in ("faulty_gpu", "gpu_hbm3_memory", "software_bug", "network_switch_cable"):
        assert abs(sim.component_failures[name] - expected[name]) < 4 * math.sqrt(expected[name])
    # Faults that hit a job already down do not interrupt it again.
    assert result.interruptions + result.planned_interruptions <= result.component_failures


def test_same_seed_same_run_and_every_gpu_hour_is_accounted_for():
    a = simulate_job(llama3_405b(seed=3, stragglers=StragglerModel(rate_per_node_day=0.002)))
    b = simulate_job(llama3_405b(seed=3, stragglers=StragglerModel(rate_per_node_day=0.002)))
    c = simulate_job(llama3_405b(seed=4, stragglers=StragglerModel(rate_per_node_day=0.002)))
    assert a.to_dict() == b.to_dict()
    assert a.to_dict() != c.to_dict()
    for r in (a, c):
        assert r.productive_gpu_hours + r.lost_total_gpu_hours == pytest.approx(
            r.total_gpu_hours, rel=1e-9
        )
        assert all(v >= 0 for v in r.lost_gpu_hours.values())
        assert r.lost_gpu_hours["stragglers"] > 0


def test_without_failures_only_checkpoint_stalls_cost_time():
    cfg = SimConfig(n_gpus=1024, horizon_days=2.0, failure_modes=(),
                    checkpoint=CheckpointPolicy.sync(interval_s=900.0, write_s=100.0))
    r = simulate_job(cfg)
    assert r.interruptions == 0 and r.restarts == 0
    assert r.ettr == pytest.approx(900 / 1000, abs=2e-3)
    assert r.lost_gpu_hours["checkpoint"] == pytest.approx((1 - r.ettr) * r.total_gpu_hours, rel=1e-6)


def test_ettr_falls_as_the_failure_rate_rises():
    points = sweep_failure_rate(llama3_405b(horizon_days=20.0), [0.25, 0.5, 1, 2, 4], seeds=range(2))
    ettrs = [p.ettr for p in points]
    assert ettrs == sorted(ettrs, reverse=True)
    assert ettrs[0] - ettrs[-1] > 0.2
    interruptions = [p.interruptions for p in points]
    assert interruptions == sorted(interruptions)


def test_checkpoint_interval_has_an_interior_optimum_near_young_daly():
    # Synchronous 60 s saves: Young/Daly says ~19 min between saves at a 3.1 h MTBF.
    cfg = llama3_405b(horizon_days=30.0, checkpoint=CheckpointPolicy.sync(interval_s=1, write_s=60))
    yd = young_daly_interval_s(save_cost_s=60, mtbf_s=cfg.mtbf_s())
    grid = [yd / 8, yd / 4, yd / 2, yd, yd * 2, yd * 4, yd * 8]
    points = sweep_checkpoint_interval(cfg, grid, seeds=range(3))
    best = max(points, key=lambda p: p.ettr)
    assert yd / 2 <= best.value <= yd * 2
    assert points[0].ettr < best.ettr - 0.01  # saving too often: stalls
    assert points[-1].ettr < best.ettr - 0.03  # too rarely: recomputation
    # Where the time goes at the extremes: stalls on the left, lost work on the right.
    assert points[0].lost_gpu_hours["checkpoint"] > 4 * points[-1].lost_gpu_hours["checkpoint"]
    assert points[-1].lost_gpu_hours["lost_work"] > 4 * points[0].lost_gpu_hours["lost_work"]


def test_hot_spares_shorten_recovery_but_cost_idle_gpus():
    base = llama3_405b(horizon_days=20.0, seed=1)
    cold = simulate_job(base.with_(recovery=base.recovery.with_(hot_spares=0)))
    hot = simulate_job(base.with_(recovery=base.recovery.with_(hot_spares=32)))
    assert cold.spare_swaps == 0 and cold.cold_replacements > 50
    # The same faults (same seed) needed the same node swaps, from the pool this time.
    assert hot.cold_replacements == 0 and abs(hot.spare_swaps - cold.cold_replacements) <= 3
    assert hot.lost_gpu_hours["replacement"] < cold.lost_gpu_hours["replacement"] / 10
    assert hot.ettr > cold.ettr + 0.02
    assert hot.spare_gpu_hours == 32 * 8 * hot.wall_hours
    assert hot.goodput < hot.ettr  # the spares' idle hours are paid for


def test_a_small_spare_pool_runs_dry_unless_repairs_refill_it():
    base = llama3_405b(horizon_days=20.0, seed=2)
    slow_repair = base.recovery.with_(hot_spares=2, repair_s=1000 * 86400)
    dry = simulate_job(base.with_(recovery=slow_repair))
    assert dry.spare_swaps == 2 and dry.cold_replacements > 50
    refilled = simulate_job(base.with_(recovery=slow_repair.with_(repair_s=1800)))
    assert refilled.spare_swaps > 10 * refilled.cold_replacements


def test_async_saves_stall_less_than_sync_saves_of_the_same_checkpoint():
    base = llama3_405b(horizon_days=10.0, seed=5)
    sync = simulate_job(base.with_(checkpoint=CheckpointPolicy.sync(interval_s=600, write_s=60)))
    async_ = simulate_job(base.with_(
        checkpoint=CheckpointPolicy(interval_s=600, save_blocking_s=5, persist_s=55)))
    assert async_.lost_gpu_hours["checkpoint"] < sync.lost_gpu_hours["checkpoint"] / 5
    assert async_.ettr > sync.ettr


def test_lost_work_per_failure_is_about_half_an_interval():
    interval = 3600.0
    cfg = SimConfig(n_gpus=8192, horizon_days=60.0, seed=3,
                    failure_modes=tuple(single_mode(1 / (8192 * 8.0))),  # one per 8 h
                    checkpoint=CheckpointPolicy.sync(interval_s=interval, write_s=30.0))
    r = simulate_job(cfg)
    per_failure_s = r.lost_gpu_hours["lost_work"] * 3600 / r.n_gpus / r.interruptions
    assert 0.35 * interval < per_failure_s < 0.65 * interval


def test_excluding_detected_stragglers_recovers_most_of_their_cost():
    stragglers = StragglerModel(rate_per_node_day=0.003, detect_s=300, duration_mean_s=4 * 3600)
    base = llama3_405b(horizon_days=20.0, seed=4)
    report = simulate_job(base.with_(stragglers=stragglers))
    exclude = simulate_job(base.with_(stragglers=stragglers.with_(mitigation="exclude")))
    assert report.stragglers == exclude.stragglers > 50
    assert report.stragglers_excluded == 0 and exclude.stragglers_excluded > 0
    assert exclude.lost_gpu_hours["stragglers"] < report.lost_gpu_hours["stragglers"] / 4
    assert exclude.ettr > report.ettr


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CheckpointPolicy(interval_s=0), "interval_s must be > 0"),
        (lambda: CheckpointPolicy(save_blocking_s=-1), "save_blocking_s must be a finite number"),
        (lambda: RecoveryPolicy(hot_spares=-2), "hot_spares must be an int >= 0"),
        (lambda: StragglerModel(mitigation="pray"), "mitigation must be none, report or exclude"),
        (lambda: SimConfig(n_gpus=0), "n_gpus must be an int >= 1"),
        (lambda: SimConfig(horizon_days=float("nan")), "horizon_days must be > 0"),
    ],
)
def test_bad_settings_are_refused_with_the_field_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_llama3_preset_counts_the_interruptions_it_was_given_and_stays_above_90_percent():
    # Published: 419 unexpected interruptions in 54 days, > 90% effective training time.
    # The rates ARE the 419 counts divided by their exposure: getting 419 back checks the
    # event engine's bookkeeping (less what strikes while the job is already down), not the
    # model. The ETTR rests on assumed relaunch and checkpoint costs
    # (docs/calibration-simulation.md, Result 2: which relaunch times keep it above 90%).
    runs = [simulate_job(llama3_405b(seed=s)) for s in range(3)]
    mean = sum(r.interruptions for r in runs) / len(runs)
    assert abs(mean - 419) < 2 * math.sqrt(419 / len(runs)) + 0.05 * 419
    assert all(r.ettr > 0.90 for r in runs)


def test_fitted_optimum_is_not_locked_to_the_sweep_grid():
    from fm_pipeline.sim.calibration import fitted_optimum
    from fm_pipeline.sim.sweep import SweepPoint

    def point(v):  # ETTR peaking at 500 s on a log scale
        return SweepPoint(v, 0.9 - (math.log(v / 500)) ** 2, 0.0, 0.0, 0.0, {}, ())

    assert fitted_optimum([point(v) for v in (100, 200, 400, 800, 1600)]) == pytest.approx(500)
    # At the edge of the grid there is nothing to fit: the grid must be widened.
    assert fitted_optimum([point(v) for v in (1000, 2000, 4000)]) == 1000


def test_the_fast_tier_raises_ettr_at_16k_gpus_and_changes_nothing_when_it_survives_nothing():
    from fm_pipeline.sim import llama3_405b, simulate_job
    from fm_pipeline.sim.config import FastTierPolicy

    base = llama3_405b()
    durable = simulate_job(base)
    fast = simulate_job(base.with_(fast_tier=FastTierPolicy(interval_s=30.0, restart_s=60.0)))
    assert fast.ettr > durable.ettr
    assert fast.in_job_restarts > 0.5 * fast.restarts  # the rest: planned, job-wide, pairs
    assert fast.lost_gpu_hours["lost_work"] < durable.lost_gpu_hours["lost_work"] / 2
    # Surviving nothing, the fast tier is the durable path exactly (same failure stream).
    none = simulate_job(base.with_(fast_tier=FastTierPolicy(interval_s=30.0, survivable=0.0)))
    assert none.ettr == durable.ettr and none.in_job_restarts == 0


def test_a_fast_tier_policy_out_of_range_is_refused_naming_the_field():
    from fm_pipeline.sim.config import FastTierPolicy

    with pytest.raises(ValueError, match="survivable"):
        FastTierPolicy(survivable=2.0)
    with pytest.raises(ValueError, match="interval_s"):
        FastTierPolicy(interval_s=-1.0)
