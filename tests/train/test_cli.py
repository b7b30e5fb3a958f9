"""Bad input never starts training: exit code 2 and a message that names the problem."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fm_pipeline.config import dump_job
from fm_pipeline.data.testing import small_job
from fm_pipeline.rundir import exit_codes
from tests.conftest import REPO
from tests.train.launch import env_for, train, write_job


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fm_pipeline.train", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_invalid_parallelism_is_refused_naming_the_degrees(tmp_path, fm_home):
    data = dump_job(small_job())
    data["parallelism"] = {"nproc_per_node": 2, "dp_shard": 2, "tp": 2}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    out = _run(["--job", str(path)], env_for(fm_home))
    assert out.returncode == exit_codes.BAD_CONFIG
    assert "dp_replicate 1 x dp_shard 2 x tp 2 x pp 1 = 4 must equal world size 2" in out.stderr


def test_a_launch_with_another_world_size_is_refused_naming_the_degrees(tmp_path, fm_home):
    path = write_job(tmp_path, "four-ranks", nproc=4, **{"parallelism.dp_shard": 2,
                                                          "parallelism.tp": 2})
    env = env_for(fm_home, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    out = _run(["--job", str(path)], env)
    assert out.returncode == exit_codes.BAD_CONFIG
    assert "dp_shard 2 x pp 1 x tp 2 = 4 ranks, but torchrun started 2" in out.stderr


def test_unknown_override_is_refused(tmp_path, fm_home):
    path = write_job(tmp_path, "ok", nproc=1)
    out = _run(["--job", str(path), "--set", "training.stepz=3"], env_for(fm_home))
    assert out.returncode == exit_codes.BAD_CONFIG
    assert "training.stepz" in out.stderr


@pytest.mark.slow
def test_a_job_whose_data_mix_was_never_prepared_is_refused(tmp_path, fm_home):
    path = write_job(tmp_path, "no-data", nproc=1)  # fresh FM_HOME: its store has no mix
    out = train(fm_home, path)
    assert out.returncode == exit_codes.BAD_CONFIG
    assert "is not published" in out.stderr and "fm data prepare" in out.stderr
    assert not (fm_home / "runs" / "no-data" / "checkpoints").exists()


@pytest.mark.slow
def test_resume_from_something_that_is_not_a_checkpoint_is_refused(workspace, tmp_path):
    job = write_job(workspace.jobs, "bad-resume", nproc=1)
    not_a_checkpoint = tmp_path / "step-00000004"
    not_a_checkpoint.mkdir()
    out = train(workspace.home, job, "--resume-from", str(not_a_checkpoint))
    assert out.returncode == exit_codes.BAD_CONFIG
    assert f"cannot read the checkpoint of --resume-from {not_a_checkpoint}" in out.stderr
    # nothing was written: the checkpoint root may exist (copy discovery), no step in it
    assert not list((workspace.home / "runs" / "bad-resume").glob("checkpoints/step-*"))
