"""FP8 training (torchao Float8Linear) resumes like any other: the fp8-fsdp4 run of the
layouts launch, continued from its step-4 checkpoint in new processes, ends at step 8 with
the same weights and optimizer state as the uninterrupted run, bit for bit."""

from __future__ import annotations

import pytest
import torch

from fm_pipeline.checkpoint import load_full_state
from tests.train.conftest import LAYOUTS
from tests.train.launch import failure, train, write_job
from tests.train.test_resume import _flatten, _losses

pytestmark = pytest.mark.slow


def test_fp8_same_topology_resume_is_bitwise_identical(layouts_run):
    ws = layouts_run
    job = write_job(ws.jobs, "fp8-resumed", nproc=4, **LAYOUTS["fp8-fsdp4"])
    out = train(ws.home, job, "--resume-from", str(ws.checkpoint("fp8-fsdp4", 4)),
                "--end-step", "8", nproc=4)
    assert out.returncode == 0, failure(out)
    (segment,) = ws.segments("fp8-resumed")
    assert (segment["start_step"], segment["resharded"]) == (4, False)
    keys = {"model", "optimizer"}
    straight = _flatten(load_full_state(ws.checkpoint("fp8-fsdp4", 8), keys=keys))
    resumed = _flatten(load_full_state(ws.checkpoint("fp8-resumed", 8), keys=keys))
    assert straight.keys() == resumed.keys()
    for key, value in straight.items():
        same = torch.equal(value, resumed[key]) if isinstance(value, torch.Tensor) else (
            value == resumed[key])
        assert same, key
    reference = _losses(ws, "fp8-fsdp4")
    assert _losses(ws, "fp8-resumed") == {s: reference[s] for s in range(5, 9)}
    # FP8 GEMMs round differently from fp32 ones: the same model, not the same numbers.
    assert reference[1] != _losses(ws, "fsdp4")[1]
