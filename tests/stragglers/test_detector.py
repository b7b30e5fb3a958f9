"""A rank slowed on purpose is flagged within a bounded number of samples, in the right
section, with its cost; healthy ranks with realistic noise never are."""

from __future__ import annotations

import pytest

from fm_pipeline.sim.rank_timings import SlowRank, synthetic_timings
from fm_pipeline.stragglers.detector import RankTiming, StragglerDetector


def run(detector: StragglerDetector, **kwargs) -> StragglerDetector:
    for gathered in synthetic_timings(**kwargs):
        detector.update(gathered)
    return detector


def test_slow_compute_rank_is_flagged_within_the_window_and_nobody_else():
    det = StragglerDetector(world_size=8)
    raised_at = {}
    for gathered in synthetic_timings(
        n_ranks=8, steps=300, seed=3, slow=[SlowRank(rank=5, factor=1.5, from_step=100)]
    ):
        for event in det.update(gathered):
            raised_at[event.rank] = gathered[0].step
    assert list(raised_at) == [5]
    (event,) = det.events
    assert (event.rank, event.host, event.section) == (5, "node-0000", "compute")
    assert event.first_step == 100
    assert 100 <= event.detected_step < 100 + det.window
    assert event.active and event.last_step == 299
    # 1.5x of a 1 s compute on a ~1.15 s step: about +43% per step.
    assert 0.3 < event.severity < 0.6
    assert 1.4 < event.section_ratio < 1.6


def test_gathering_every_k_steps_bounds_detection_in_steps_and_scales_the_cost():
    every = 10
    det = run(
        StragglerDetector(world_size=4),
        n_ranks=4, steps=2000, every=every, seed=1,
        slow=[SlowRank(rank=2, factor=2.0, from_step=500, to_step=1500)],
    )
    (event,) = det.events
    assert event.rank == 2 and event.section == "compute"
    assert event.detected_step - 500 < det.window * every
    assert event.recovered_step is not None and event.recovered_step < 1500 + det.window * every
    # ~1 s excess per step for 1000 steps, 3 peers waiting: ~3000 GPU-s = 0.83 GPU-h.
    assert event.idle_gpu_hours == pytest.approx(1000 * 1.0 * 3 / 3600, rel=0.15)


def test_slow_data_loader_is_blamed_on_data_wait_not_on_compute():
    det = run(
        StragglerDetector(),
        n_ranks=8, steps=200, seed=2,
        slow=[SlowRank(rank=0, section="data_wait", factor=1.0, extra_s=0.4, from_step=50)],
    )
    assert [(e.rank, e.section) for e in det.events] == [(0, "data_wait")]


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_peers_waiting_in_the_collective_are_victims_not_stragglers(n_ranks):
    # With 2-3 ranks the victims' collective wait stands out as much as the straggler's
    # compute; only the straggler may be blamed.
    det = run(
        StragglerDetector(),
        n_ranks=n_ranks, steps=300, seed=4, slow=[SlowRank(rank=1, factor=1.8, from_step=100)],
    )
    assert [(e.rank, e.section) for e in det.events] == [(1, "compute")]


def test_one_off_spikes_and_short_bursts_raise_nothing():
    # A GC storm on one rank for 4 consecutive steps, and 3% of samples with big spikes.
    det = run(
        StragglerDetector(world_size=8),
        n_ranks=8, steps=600, seed=5, spike_prob=0.03, spike_s=(0.5, 3.0),
        slow=[SlowRank(rank=6, factor=3.0, from_step=300, to_step=304)],
    )
    assert det.events == []


@pytest.mark.parametrize(("n_ranks", "seed"), [(2, 10), (16, 11)])
def test_long_clean_run_with_realistic_noise_has_no_false_positives(n_ranks, seed):
    # Lognormal jitter, +-2% per-GPU speed spread, 1% GC-like spikes, data hiccups, and
    # whole-step slowdowns shared by everybody: 2000 gathered steps.
    det = run(StragglerDetector(world_size=n_ranks), n_ranks=n_ranks, steps=2000, seed=seed)
    assert det.events == []
    assert det.idle_gpu_hours == 0


def test_pipeline_stages_are_compared_only_with_their_own_stage():
    def gathered(step):
        # Stage 1 does twice the work of stage 0 by design; rank 3 is a real straggler.
        compute = {0: 1.0, 1: 1.01, 2: 2.0, 3: 3.0, 4: 2.02, 5: 1.99}
        return [
            RankTiming(step=step, rank=r, host=f"h{r}", compute_s=c + 0.001 * (step % 3),
                       collective_wait_s=0.1, data_wait_s=0.001, peer_group=0 if r < 2 else 1)
            for r, c in compute.items()
        ]

    det = StragglerDetector(world_size=6)
    for step in range(20):
        det.update(gathered(step))
    assert [(e.rank, e.section) for e in det.events] == [(3, "compute")]


def test_records_from_json_lines_and_bad_input_name_the_problem():
    det = StragglerDetector(world_size=2)
    ok = {"step": 0, "rank": 0, "host": "a", "compute_s": 1.0, "collective_wait_s": 0.1}
    det.update([ok, {**ok, "rank": 1}])
    with pytest.raises(ValueError, match="lacks compute_s"):
        RankTiming.from_dict({"step": 1, "rank": 0, "collective_wait_s": 0.1})
    with pytest.raises(ValueError, match="compute_s must be a finite number"):
        det.update([{**ok, "step": 1, "compute_s": -1.0}, {**ok, "step": 1, "rank": 1}])
    with pytest.raises(ValueError, match="after step 0"):
        det.update([ok, {**ok, "rank": 1}])
    with pytest.raises(ValueError, match="use a new StragglerDetector"):
        det.update([{**ok, "step": 2}, {**ok, "step": 2, "rank": 7}])
    with pytest.raises(ValueError, match="expected world_size 4"):
        StragglerDetector(world_size=4).update([ok, {**ok, "rank": 1}])


def test_the_simulator_takes_its_straggler_detection_delay_from_the_detector():
    from fm_pipeline.sim.config import StragglerModel

    det = StragglerDetector(window=8, persist=6)
    model = StragglerModel.from_detector(det, step_time_s=6.0, gather_every_steps=10,
                                         rate_per_node_day=0.001, mitigation="exclude")
    # 6 slow samples, one every 10 steps of 6 s, +half a gather until the first: 390 s.
    assert model.detect_s == pytest.approx(390.0)
    assert model.mitigation == "exclude"
