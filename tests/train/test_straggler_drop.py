"""The straggler drop's gradient: a rank computing fewer rows of each micro-batch, its
gradient scaled by dp * rows / sum(rows), gives exactly the mean gradient over the rows the
ranks computed (2 ranks, FSDP2 on gloo, against a plain model on those rows)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO
from tests.train.launch import env_for, failure, torchrun_cmd, write_job


@pytest.mark.parametrize("plan", ["2,1", "1,2", "2,2"])
def test_a_dropped_rows_gradient_is_the_mean_over_the_rows_computed(tmp_path, plan):
    job = write_job(tmp_path, "drop", nproc=2)
    out = subprocess.run(torchrun_cmd(2, "tests/train/_drop_worker.py", str(job), plan),
                         cwd=REPO, env=env_for(tmp_path / "home"), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, failure(out)
    assert "DROP-GRADIENTS-MATCH" in out.stdout
