"""Superseded checkpoints (a rollback, see supersede.py) in one process: a re-save of the step
replaces a store copy that holds a stale file of another layout, retention keeps them out of
last-k, and the chosen checkpoint stays selectable."""

from __future__ import annotations

import logging

from fm_pipeline.catalog import CheckpointRef, apply_retention, latest_valid, validate
from tests.local_site import local_root
from fm_pipeline.catalog.set_aside import list_set_aside
from fm_pipeline.catalog.refs import MANIFEST
from fm_pipeline.catalog.supersede import supersede_newer
from fm_pipeline.checkpoint import CheckpointManager, restore
from fm_pipeline.storage import open_store
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site

PREFIX = "checkpoints/ckpt-test"


def test_a_resave_replaces_the_superseded_store_copy_and_its_stale_files(fm_home, caplog):
    store = open_store(fm_home / "store")
    job = tiny_job(upload=True)
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(job, trainer.app_state, store=store, async_save=False, site=local_site.site())
    for step in (1, 2, 3):
        trainer.step(step)
        manager.save(step, tokens_seen=32 * step)
    # A shard only the old layout wrote (e.g. a second rank's): a stale extra file.
    store.put_bytes(b"old layout", f"{PREFIX}/step-00000002/__1_0.distcp")
    root = local_root(job.name)

    chosen = CheckpointRef.local(root / "step-00000001")
    restore(trainer.app_state, chosen, job=job)
    gone = supersede_newer(job.name, chosen, chosen.read_bytes(MANIFEST), root=root,
                           store=store)
    assert len(gone) == 4  # steps 2 and 3, in both tiers
    for tier in ("local", "store"):
        found = latest_valid(job, store=store, tiers=(tier,), checksums=False, root=local_site.root_of(job))
        assert found.found.step == 1, tier
        assert [str(p) for p in validate(found.found, job)] == []
    # Retention keeps superseded checkpoints and does not count them: keep_last=1 keeps 1.
    report = apply_retention(job.name, keep_last=1, job=job, root=local_site.root_of(job.name))
    assert report.deleted == {} and report.kept[1] and report.kept[3] == ["superseded"]

    trainer.step(2)
    with caplog.at_level(logging.WARNING):
        manager.save(2, tokens_seen=64)
    manager.close()
    assert caplog.text.count("set aside (superseded: the job was resumed from step 1") == 2
    remote = CheckpointRef.remote(store, f"{PREFIX}/step-00000002")
    assert "__1_0.distcp" not in remote.files() and validate(remote, job) == []
    assert len(list(root.glob("superseded/*/step-00000002"))) == 1
    # The store's superseded copy is kept too, stale file and all, with its reason.
    aside = [e for e in list_set_aside(job.name, store=store, root=local_site.root_of(job.name)) if not e.ref.is_local]
    assert [(e.ref.step, e.kind) for e in aside] == [(2, "superseded")]
    assert "__1_0.distcp" in aside[0].ref.files() and "resumed from step 1" in aside[0].reason
    for tier in ("local", "store"):
        found = latest_valid(job, store=store, tiers=(tier,), checksums=False, root=local_site.root_of(job))
        assert found.found.step == 2, tier
        assert any("step-00000003" in line and "resumed from step 1" in line
                   for line in found.skipped_lines())


def test_a_checkpoint_marked_invalid_cannot_be_named_in_a_resume(fm_home):
    import pytest

    from fm_pipeline.catalog.validate import CheckpointInvalid, Problem
    from fm_pipeline.catalog.validity import record_invalid
    from fm_pipeline.checkpoint.load import resume

    store = open_store(fm_home / "store")
    job = tiny_job(upload=True)
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(job, trainer.app_state, store=store, async_save=False, site=local_site.site())
    for step in (1, 2):
        trainer.step(step)
        manager.save(step, tokens_seen=32 * step)
    manager.close()
    root = local_root(job.name)
    bad = CheckpointRef.local(root / "step-00000001")
    record_invalid(bad, [Problem("__0_0.distcp", "checksum mismatch (a restore found it)")])
    # Discovery already skipped it; naming it by hand used to restore it anyway.
    with pytest.raises(CheckpointInvalid, match="checksum mismatch") as refused:
        resume(trainer.app_state, job, store=store, root=root, resume_from=bad)
    assert "a restore found it corrupt" in str(refused.value)
    good = CheckpointRef.local(root / "step-00000002")
    assert resume(trainer.app_state, job, store=store, root=root, resume_from=good).manifest.step == 2
