"""Saved at 4-rank FSDP2, restored at 2 ranks and in one process (plain module): every parameter and
optimizer entry bitwise equal to the state that was saved, data cursor and LR step too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from fm_pipeline.catalog import latest_valid, read_manifest
from fm_pipeline.checkpoint import load_full_state, restore_latest
from fm_pipeline.checkpoint.state import OPTIM_OPTIONS
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests.conftest import REPO
from tests import local_site


def torchrun(nproc: int, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "tests.checkpoint.dist_worker", *args]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


def assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: keys differ: {sorted(a.keys() ^ b.keys())[:5]}"
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"{what}: {k} differs"
        else:
            assert a[k] == b[k], f"{what}: {k}: {a[k]} != {b[k]}"


@pytest.mark.slow
def test_fsdp4_checkpoint_restores_bitwise_at_2_ranks_and_1(tmp_path):
    torchrun(4, "save", str(tmp_path))
    found = latest_valid(tiny_job(), root=local_site.root_of(tiny_job()))
    manifest = read_manifest(found.found)
    assert manifest.step == 3 and manifest.parallelism.world_size == 4
    assert manifest.parallelism.mesh.dim_names == ["dp_shard"]
    assert manifest.parallelism.mesh.shape == [4]
    assert {f.path for f in manifest.files} >= {f"__{r}_0.distcp" for r in range(4)}
    source = torch.load(tmp_path / "source.pt", weights_only=False)
    # torch's own single-process reader sees the same tensors as the gathered live state
    on_disk = load_full_state(found.found, keys={"model"})["model"]
    assert_same(on_disk, source["model"], "files vs live model")

    torchrun(2, "load", str(tmp_path), "2")
    loaded = torch.load(tmp_path / "loaded-2.pt", weights_only=False)
    assert_same(loaded["model"], source["model"], "model at 2 ranks")
    assert_same(loaded["optimizer"], source["optimizer"], "optimizer at 2 ranks")
    assert loaded["cursor"] == source["cursor"] == {"samples_consumed": 12}
    assert loaded["lr_epoch"] == source["lr_epoch"] == 3

    # One process, no process group, a plain unsharded module.
    single = Trainer(TinyLM())
    assert restore_latest(single.app_state, tiny_job(), root=local_site.root_of(tiny_job())).step == 3
    assert_same(get_model_state_dict(single.model), source["model"], "model at 1 process")
    optim = get_optimizer_state_dict(single.model, single.opt, options=OPTIM_OPTIONS)
    assert_same(optim, source["optimizer"], "optimizer at 1 process")
    assert single.cursor.state_dict() == source["cursor"]
    assert single.sched.last_epoch == source["lr_epoch"]
