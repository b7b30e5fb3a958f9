"""`training.compile`: per-block torch.compile trains the same model as eager, the field
round-trips through the job spec, and a machine without a C++ compiler gets a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fm_pipeline.config import dump_job, parse_job
from fm_pipeline.data.testing import small_job
from fm_pipeline.parallel.compile import CompilerMissingError, check_compile_toolchain
from tests.conftest import REPO
from tests.train.launch import env_for, failure, write_job

# Two blocks: compiling on CPU costs seconds per graph (once; inductor caches on disk).
TINY = {"model.n_layers": 2, "training.steps": 3, "training.segment_steps": 3}


@pytest.mark.slow
def test_compiled_blocks_train_like_eager(workspace):
    eager = write_job(workspace.jobs, "eager-2l", nproc=1, **TINY)
    compiled = write_job(workspace.jobs, "compiled-2l", nproc=1, **TINY,
                         **{"training.compile": True})
    # One process, two segments: the world of one is set up once.
    out = subprocess.run([sys.executable, str(REPO / "tests/train/_segments_worker.py"),
                          str(eager), str(compiled)], env=env_for(workspace.home), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, failure(out)
    a, b = workspace.metrics("eager-2l"), workspace.metrics("compiled-2l")
    assert [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-4)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-3)
    assert b[-1]["loss"] < b[0]["loss"]


def test_compile_round_trips_through_the_job_spec():
    job = small_job(**{"training.compile": True})
    data = dump_job(job)
    assert data["training"]["compile"] is True
    assert parse_job(data).training.compile is True
    assert small_job().training.compile is False


def test_no_cpp_compiler_is_a_clear_error_naming_the_field(monkeypatch):
    from torch._inductor import config

    monkeypatch.setattr(config.cpp, "cxx", (None, "/nonexistent/g++"))
    with pytest.raises(CompilerMissingError) as e:
        check_compile_toolchain(torch.device("cpu"))
    assert "training.compile" in str(e.value) and "C++ compiler" in str(e.value)
    assert "/nonexistent/g++" in str(e.value)
