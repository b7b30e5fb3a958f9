"""One failure model for the planner and the simulator: the planner's Young/Daly interval
is where the simulated effective training time peaks, at three job sizes."""

from __future__ import annotations

import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.reliability import reliability
from fm_pipeline.sim.calibration import fitted_optimum
from fm_pipeline.sim.config import CheckpointPolicy, RecoveryPolicy, SimConfig
from fm_pipeline.sim.sweep import geometric_grid, sweep_checkpoint_interval

H100 = make_cluster("h100")  # no failure rate given: Llama 3's per GPU, node and job


@pytest.mark.parametrize("gpus", [1024, 4096, 16384])
def test_the_planners_interval_is_the_simulated_optimum_within_20_percent(gpus):
    # A 70B model's 840 GB checkpoint written synchronously at 10 GB/s (84 s a save).
    rel = reliability(params=70e9, gpus=gpus, cluster=H100, step_time_s=5.0, async_save=False)
    cfg = SimConfig(n_gpus=gpus, horizon_days=54.0, recovery=RecoveryPolicy(
        restart_s=H100.restart_overhead_s), checkpoint=CheckpointPolicy.sync(
            interval_s=rel.interval_s, write_s=rel.checkpoint_write_s, load_s=rel.restore_s))
    assert cfg.mtbf_s() / 3600 == pytest.approx(rel.job_mtbf_h)  # the same failures
    points = sweep_checkpoint_interval(cfg, geometric_grid(rel.interval_s, factor=4.0, points=9),
                                       seeds=range(4))
    assert fitted_optimum(points) == pytest.approx(rel.interval_s, rel=0.2)
