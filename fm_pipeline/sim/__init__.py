"""Cluster-scale simulation: what failures, checkpoints, stragglers and queues cost a
training run on thousands of GPUs, without the GPUs.

    from fm_pipeline.sim import llama3_405b, simulate_job
    result = simulate_job(llama3_405b(seed=0))
    print(result.ettr, result.interruptions, result.lost_gpu_hours)

    fm simulate job --plot out/          # the same (Llama 3 405B preset) from the shell

See docs/simulation.md for the model and docs/calibration-simulation.md for how it
reproduces Llama 3 405B's published interruption count and effective training time.
"""

from fm_pipeline.sim.config import (
    CheckpointPolicy,
    RecoveryPolicy,
    SimConfig,
    StragglerModel,
    llama3_405b,
)
from fm_pipeline.sim.failures import FailureMode, llama3_failure_modes, single_mode
from fm_pipeline.sim.results import SimResult
from fm_pipeline.sim.single_job import simulate_job

__all__ = [
    "CheckpointPolicy", "FailureMode", "RecoveryPolicy", "SimConfig", "SimResult",
    "StragglerModel", "llama3_405b", "llama3_failure_modes", "simulate_job", "single_mode",
]
