"""Helpers for trainer tests: job specs on the small real data mix, and launching segments
the way users do (torchrun, or plain python for a world of one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from fm_pipeline.config import dump_job
from fm_pipeline.data.testing import small_job
from tests.conftest import REPO

# Steps and learning rate chosen so the debug model's loss clearly falls within 6 steps.
BASE = {
    "model.size": "debug", "model.vocab_size": 512,
    "training.seq_len": 32, "training.global_batch_size": 8, "training.micro_batch_size": 2,
    "training.lr": 1e-2, "training.min_lr": 1e-3, "training.warmup_steps": 1,
    "training.steps": 8, "training.segment_steps": 8, "training.rank_timings_every": 2,
    "checkpoint.every_steps": 100, "checkpoint.keep_last": 10, "checkpoint.upload": False,
}


def write_job(directory: Path, name: str, *, nproc: int, **overrides) -> Path:
    """A job spec file for `nproc` local ranks; `overrides` use dotted keys."""
    settings = {**BASE, "name": name, "parallelism.nproc_per_node": nproc, **overrides}
    job = small_job(**settings)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dump_job(job)))
    return path


def env_for(fm_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FM_", "MLFLOW_", "DAGSTER_PIPES_", "TORCHELASTIC_"))}
    env.update(FM_HOME=str(fm_home), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def torchrun_cmd(nproc: int, *target: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *target]


def failure(out: subprocess.CompletedProcess) -> str:
    """The worker's own error lines first (torchrun's summary hides them), then the tail."""
    lines = (out.stdout + out.stderr).splitlines()
    errors = [ln for ln in lines if "Error" in ln or ln.startswith("error")][:20]
    return "\n".join(errors) + "\n...\n" + out.stderr[-3000:]


def train(fm_home: Path, job: Path, *args: str, nproc: int | None = None, timeout: float = 300,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`torchrun -m fm_pipeline.train` (or `python -m fm_pipeline.train` when nproc is None)."""
    target = ["-m", "fm_pipeline.train", "--job", str(job), *args]
    cmd = [sys.executable, *target] if nproc is None else torchrun_cmd(nproc, *target)
    return subprocess.run(cmd, env=env or env_for(fm_home), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def run_segments(fm_home: Path, jobs: list[str], *, nproc: int, timeout: float = 400):
    """Several segments in one torchrun launch (tests/train/_segments_worker.py); each item
    is a job spec path, or `path@N` to stop after step N."""
    cmd = torchrun_cmd(nproc, str(REPO / "tests/train/_segments_worker.py"), *jobs)
    return subprocess.run(cmd, env=env_for(fm_home), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
