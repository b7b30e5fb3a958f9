"""Mixture-of-Experts checkpoints across expert-parallel layouts: the same topology resumes
bitwise; the experts and their optimizer state reshard through DCP when ep or the world
changes (ep 2 x dp_shard 2 at 4 ranks -> ep 2 at 2 ranks -> ep 1, dp 2 -> ep 2 again), each
continuing the loss trajectory of the uninterrupted moe-ep2 run of the layouts launch.
"""

from __future__ import annotations

import pytest
import torch

from fm_pipeline.catalog import CheckpointRef, read_manifest
from fm_pipeline.checkpoint import load_full_state
from tests.train.conftest import EXACT_MOE, LAYOUTS
from tests.train.launch import failure, train
from tests.train.test_resume import LOSS_TOLERANCE, _flatten, _losses, _resume

REFERENCE = "moe-ep2"
MOE = {k: v for k, v in LAYOUTS[REFERENCE].items() if k.startswith("model.")}

pytestmark = pytest.mark.slow


def _assert_continues(ws, name: str, *, source: str, from_step: int, end_step: int, ep: int):
    (segment,) = ws.segments(name)
    assert segment["start_step"] == from_step and segment["end_step"] == end_step
    assert segment["resharded"] is True
    reference, resumed = _losses(ws, REFERENCE), _losses(ws, name)
    assert sorted(resumed) == list(range(from_step + 1, end_step + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=LOSS_TOLERANCE), (step, resumed)
    manifest = read_manifest(CheckpointRef.local(ws.checkpoint(name, end_step)))
    assert manifest.parallelism.ep == ep  # the expert topology the checkpoint was written at


def test_same_topology_moe_resume_is_bitwise_identical(layouts_run):
    ws = layouts_run
    out = train(ws.home, ws.jobs / f"{EXACT_MOE}.yaml", nproc=4)  # newest checkpoint: step 3
    assert out.returncode == 0, failure(out)
    assert [s["start_step"] for s in ws.segments(EXACT_MOE)] == [0, 3]
    straight = _flatten(load_full_state(ws.checkpoint(REFERENCE, 8), keys={"model", "optimizer"}))
    resumed = _flatten(load_full_state(ws.checkpoint(EXACT_MOE, 8), keys={"model", "optimizer"}))
    assert straight.keys() == resumed.keys()
    assert any(".experts.w1" in k and k.startswith("optimizer.") for k in straight)
    for key, value in straight.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed[key]), key
        else:
            assert value == resumed[key], key
    assert _losses(ws, EXACT_MOE) == _losses(ws, REFERENCE)


def test_experts_reshard_when_ep_and_the_world_change(layouts_run):
    ws = layouts_run
    chain = [  # name, ep at 2 ranks, from (source, step)
        ("moe-ep2-2ranks", 2, REFERENCE, 2),   # world 4 -> 2, ep kept: expert FSDP 2 -> 1
        ("moe-dp2-from-ep2", 1, "moe-ep2-2ranks", 4),  # ep 2 -> 1: pure data parallel
        ("moe-ep2-from-dp2", 2, "moe-dp2-from-ep2", 6),  # and back
    ]
    for name, ep, source, step in chain:
        _resume(ws, name, nproc=2, source=source, from_step=step, end_step=step + 2,
                **MOE, **{"parallelism.dp_shard": 2, "parallelism.ep": ep,
                          "checkpoint.every_steps": 2})
        _assert_continues(ws, name, source=source, from_step=step, end_step=step + 2, ep=ep)


def test_a_pipelined_moe_checkpoint_resumes_without_stages_on_ep4(layouts_run):
    """pp 2 x ep 2 (each stage's experts over 2 ranks) -> one stage, the experts over all 4
    ranks: the stages' layers and the experts with their optimizer state reshard, and the
    loss goes on as the uninterrupted run's."""
    ws = layouts_run
    _resume(ws, "moe-ep4-from-pp2", nproc=4, source="moe-pp2-ep2", from_step=4, end_step=6,
            **MOE, **{"parallelism.dp_shard": 4, "parallelism.ep": 4,
                      "checkpoint.every_steps": 2})
    _assert_continues(ws, "moe-ep4-from-pp2", source="moe-pp2-ep2", from_step=4, end_step=6,
                      ep=4)
    assert read_manifest(CheckpointRef.local(ws.checkpoint("moe-pp2-ep2", 4))).parallelism.pp == 2
