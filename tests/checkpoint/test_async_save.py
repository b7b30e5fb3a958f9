"""An async save blocks the loop only for staging; the write overlaps the next steps and
captures the state as it was at the save step."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from fm_pipeline.catalog import read_manifest, validate
from fm_pipeline.catalog.set_aside import list_set_aside
from fm_pipeline.catalog.refs import CheckpointRef
from fm_pipeline.checkpoint import CheckpointManager, Probe, load_full_state
from tests.checkpoint.tiny import TinyLM, Trainer, batch, tiny_job
from tests import local_site


@pytest.fixture
def gated_writes(monkeypatch):
    """Hold every DCP write until the test opens the gate; `writing` is set when one starts."""
    gate, writing = threading.Event(), threading.Event()
    original = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        writing.set()
        assert gate.wait(60), "test never opened the write gate"
        return original(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", write_data)
    yield gate, writing
    gate.set()


def test_async_save_returns_after_staging_and_saves_the_step_state(gated_writes):
    gate, writing = gated_writes
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=True, site=local_site.site())
    trainer.step(1)
    at_save = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    future = manager.save(1, tokens_seen=32)
    assert writing.wait(30)
    assert not future.done()  # save() returned while the write is still pending
    trainer.step(2)  # training goes on and changes the live weights in place
    trainer.step(3)
    gate.set()
    result = manager.close()

    assert result.committed
    ev = result.events
    assert ev["returned"] < ev["write_started"] < ev["write_finished"] < ev["committed"]
    saved = load_full_state(result.path, keys={"model"})["model"]
    assert all(torch.equal(saved[k], at_save[k]) for k in at_save)
    live = trainer.model.state_dict()
    assert any(not torch.equal(saved[k], live[k]) for k in at_save)


def test_second_save_while_one_is_in_flight_is_skipped_with_a_reason(gated_writes, caplog):
    gate, writing = gated_writes
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=True, on_busy="skip", site=local_site.site())
    trainer.step(1)
    manager.save(1, tokens_seen=32)
    assert writing.wait(30)
    trainer.step(2)
    assert manager.save(2, tokens_seen=64) is None
    assert manager.skipped == [(2, "the previous save is still being written (on_busy=skip)")]
    assert "checkpoint at step 2 skipped" in caplog.text
    gate.set()
    trainer.step(3)
    final = manager.save(3, tokens_seen=96, final=True)  # waits for step 1, never skipped
    manager.close()
    assert final.result().committed
    steps = sorted(p.name for p in manager.root.iterdir())
    assert steps == ["step-00000001", "step-00000003"]


def test_sync_save_is_committed_when_save_returns_and_records_the_run(tmp_path):
    trainer = Trainer(TinyLM())
    job = tiny_job()
    manager = CheckpointManager(job, trainer.app_state, async_save=False, mix_key="mix-abc", site=local_site.site())
    for step in (1, 2):
        trainer.step(step)
    probe_tokens = batch(99)
    future = manager.save(2, tokens_seen=64, probe=Probe(probe_tokens, loss=3.25))
    assert future.done() and future.result().committed
    ref = CheckpointRef.local(future.result().path)
    manifest = read_manifest(ref)
    assert (manifest.step, manifest.tokens_seen, manifest.job) == (2, 64, job.name)
    assert manifest.data.mix == "mix-abc" and manifest.data.cursor == {"samples_consumed": 8}
    assert manifest.model.hash == job.model_cfg.config_hash()
    assert manifest.parallelism.world_size == 1
    assert manifest.state_keys == ["dataloader", "lr_scheduler", "model", "optimizer"]
    assert manifest.probe.loss == 3.25 and manifest.probe.batch_shape == list(probe_tokens.shape)
    assert torch.equal(torch.load(ref.dir / "probe.pt"), probe_tokens)
    names = {f.path for f in manifest.files}
    assert names == {"__0_0.distcp", ".metadata", "probe.pt"}
    assert manifest.total_bytes == sum(f.size for f in manifest.files)
    assert manifest.code.package_version and manifest.code.torch_version
    assert manifest.timings.write_s > 0 and not manifest.timings.async_save
    assert json.loads((ref.dir / "manifest.json").read_text())["format"] == "fm-checkpoint/1"
    manager.close()


def test_saving_a_step_that_is_already_committed_is_skipped():
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=False, site=local_site.site())
    trainer.step(1)
    manager.save(1, tokens_seen=32)
    before = (manager.root / "step-00000001" / "manifest.json").read_bytes()
    assert manager.save(1, tokens_seen=32) is None
    assert "already a valid committed checkpoint" in manager.skipped[0][1]
    assert (manager.root / "step-00000001" / "manifest.json").read_bytes() == before
    manager.close()


def test_saving_over_a_committed_step_that_fails_validation_replaces_it_and_keeps_it_aside():
    """A manifest that exists is not a checkpoint that validates: a truncated shard at step 1
    is set aside (kept, with the reason) and the new save of step 1 commits."""
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=False, site=local_site.site())
    trainer.step(1)
    manager.save(1, tokens_seen=32)
    shard = manager.root / "step-00000001" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-7])
    before = (manager.root / "step-00000001" / "manifest.json").read_bytes()
    assert manager.save(1, tokens_seen=32).result().committed
    manager.close()
    assert validate(CheckpointRef.local(manager.root / "step-00000001")) == []
    (aside,) = list_set_aside("ckpt-test", root=local_site.root_of("ckpt-test"))
    assert aside.kind == "invalid" and "__0_0.distcp: size" in aside.reason
    assert aside.ref.read_bytes("manifest.json") == before
