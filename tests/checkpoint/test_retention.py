"""Retention keeps the last K, milestones, drill-passed/evaluated/pinned checkpoints and the
newest valid one, and reports every deletion with the bytes freed."""

from __future__ import annotations

import logging

import pytest

from fm_pipeline.catalog import (
    apply_retention,
    list_local,
    list_store,
    store_root,
    write_mark,
)
from fm_pipeline.catalog.set_aside import list_set_aside
from tests.local_site import local_root
from fm_pipeline.catalog.refs import MANIFEST
from fm_pipeline.checkpoint import CheckpointManager
from fm_pipeline.storage import open_store
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site


@pytest.fixture
def six_checkpoints(tmp_path):
    """Steps 1..6 committed locally and in a local object store, nothing deleted yet."""
    store = open_store(tmp_path / "store")
    trainer = Trainer(TinyLM())
    job = tiny_job(keep_last=100, upload=True)
    manager = CheckpointManager(job, trainer.app_state, store=store, async_save=False, site=local_site.site())
    for step in range(1, 7):
        trainer.step(step)
        manager.save(step, tokens_seen=32 * step)
    manager.close()
    return job, store


def test_keeps_newest_valid_drill_passed_and_milestones_and_reports_bytes(six_checkpoints,
                                                                          caplog):
    job, _ = six_checkpoints
    refs = {r.step: r for r in list_local(local_root(job.name))}
    write_mark(refs[2], "drill", {"passed": True})
    write_mark(refs[3], "drill", {"passed": False, "reason": "loss mismatch"})
    (refs[6].dir / "__0_0.distcp").write_bytes(b"corrupted")  # newest is now invalid
    (refs[5].dir / MANIFEST).unlink()  # and the one before never committed
    sizes = {s: sum(r.files().values()) for s, r in refs.items()}

    caplog.set_level(logging.INFO)
    report = apply_retention(job.name, keep_last=1, milestone_every=4, job=job, root=local_site.root_of(job.name))

    # The corrupt newest counts as nothing: step 4 is both the last valid one and the newest.
    assert report.kept == {2: ["drill-passed"], 4: ["milestone", "last-k", "newest-valid"]}
    assert sorted(report.deleted) == [1, 3, 5]  # 5: an incomplete leftover older than 6
    assert report.bytes_freed == sizes[1] + sizes[3] + sizes[5]
    assert list(report.set_aside) == [6] and "truncated" in report.set_aside[6]
    assert [r.step for r in list_local(local_root(job.name))] == [2, 4]
    aside = list_set_aside(job.name, root=local_site.root_of(job.name))
    assert [(e.ref.step, e.kind) for e in aside] == [(6, "invalid")]
    assert "retention: " in aside[0].reason and (aside[0].ref.dir / "__0_0.distcp").is_file()
    assert "retention deleted" in caplog.text and "MB freed" in report.summary()


def test_never_deletes_the_newest_valid_even_with_keep_last_1(six_checkpoints):
    job, _ = six_checkpoints
    for ref in list_local(local_root(job.name))[3:]:  # 4, 5, 6 corrupt
        (ref.dir / "__0_0.distcp").write_bytes(b"x")
    report = apply_retention(job.name, keep_last=1, job=job, root=local_site.root_of(job.name))
    assert report.kept == {3: ["last-k", "newest-valid"]}
    assert sorted(report.deleted) == [1, 2] and sorted(report.set_aside) == [4, 5, 6]


def test_a_valid_checkpoint_is_never_deleted_while_a_corrupt_one_is_kept(six_checkpoints):
    """keep_last 2 with the two newest corrupt (same size, one byte flipped): the two newest
    valid ones stay, the corrupt ones leave the namespace with their reason, in both passes
    (the verified mark written at commit is stale once a file changes)."""
    job, _ = six_checkpoints
    for ref in list_local(local_root(job.name))[4:]:
        shard = ref.dir / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    report = apply_retention(job.name, keep_last=2, job=job, root=local_site.root_of(job.name))
    assert report.kept == {3: ["last-k"], 4: ["last-k", "newest-valid"]}
    assert sorted(report.deleted) == [1, 2] and sorted(report.set_aside) == [5, 6]
    again = apply_retention(job.name, keep_last=2, job=job, root=local_site.root_of(job.name))
    assert again.kept == report.kept and not again.deleted and not again.set_aside


def test_store_tier_deletes_manifest_first_and_keeps_evaluated(six_checkpoints):
    job, store = six_checkpoints
    remote = {r.step: r for r in list_store(store, store_root(job.name))}
    assert sorted(remote) == [1, 2, 3, 4, 5, 6]
    write_mark(remote[1], "eval", {"loss": {"code": 2.5}})
    sizes = {s: sum(r.files().values()) for s, r in remote.items()}
    dry = apply_retention(job.name, tier="store", store=store, keep_last=2, dry_run=True, root=local_site.root_of(job.name))
    assert sorted(dry.deleted) == [2, 3, 4] and len(list_store(store, store_root(job.name))) == 6
    report = apply_retention(job.name, tier="store", store=store, keep_last=2, root=local_site.root_of(job.name))
    assert report.kept == {1: ["evaluated"], 5: ["last-k"], 6: ["last-k", "newest-valid"]}
    assert report.deleted == {s: sizes[s] for s in (2, 3, 4)}
    assert [r.step for r in list_store(store, store_root(job.name))] == [1, 5, 6]


def test_keep_last_must_be_positive():
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        apply_retention("x", keep_last=0, root=local_site.root_of("x"))
