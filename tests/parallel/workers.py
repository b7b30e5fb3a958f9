"""Run one of this folder's torchrun workers on 2 gloo ranks, writing into `out`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import REPO
from tests.train.launch import env_for, failure, torchrun_cmd


def run_worker(script: str, out: Path, *args: str, timeout: float = 300) -> None:
    """`torchrun --nproc-per-node 2 tests/parallel/<script> <out> <args>`; fails the test
    with the workers' own errors if it does not exit 0."""
    done = subprocess.run(torchrun_cmd(2, str(REPO / "tests/parallel" / script), str(out),
                                       *args),
                          env=env_for(out), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, failure(done)
