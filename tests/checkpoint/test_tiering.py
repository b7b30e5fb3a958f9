"""Upload to a real S3 endpoint on loopback and restore from it; an S3 outage mid-upload
leaves the checkpoint uncommitted remotely, the local copy intact, and a retry commits it."""

from __future__ import annotations

import shutil

import pytest
import torch

from fm_pipeline.catalog import latest_valid, read_marks, sync_to_store, validate
from tests.local_site import local_root
from fm_pipeline.catalog.refs import CheckpointRef
from fm_pipeline.checkpoint import CheckpointManager, restore_latest
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests.conftest import free_port
from tests import local_site


def _train_and_save(store, steps=(1,), **kw):
    trainer = Trainer(TinyLM())
    job = tiny_job(upload=True)
    manager = CheckpointManager(job, trainer.app_state, store=store, async_save=False, **kw, site=local_site.site())
    results = []
    for step in steps:
        trainer.step(step)
        results.append(manager.save(step, tokens_seen=32 * step).result())
    manager.close()
    return job, trainer, results


def test_s3_upload_then_restore_on_a_machine_without_the_local_copy(s3_bucket):
    store = local_site.site().open_store(f"s3://{s3_bucket}/fm")
    job, trainer, (result,) = _train_and_save(store)
    assert result.upload.committed and result.upload.bytes == result.total_bytes
    keys = {i.key for i in store.list("checkpoints/ckpt-test/step-00000001/")}
    assert "checkpoints/ckpt-test/step-00000001/manifest.json" in keys
    found = latest_valid(job, store=store, tiers=("store",), checksums=True, root=local_site.root_of(job))
    assert found.found is not None and not found.found.is_local
    assert read_marks(found.found)["upload"]["committed"] is True

    shutil.rmtree(local_root(job.name))  # a fresh machine: only the store has it
    fresh = Trainer(TinyLM())
    restored = restore_latest(fresh.app_state, job, store=store, root=local_site.root_of(job))
    assert restored.step == 1 and restored.source.startswith(f"s3://{s3_bucket}/fm/")
    assert restored.download_s > 0 and restored.bytes_per_s > 0
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[k], v)
    assert fresh.cursor.samples_consumed == trainer.cursor.samples_consumed
    assert validate(CheckpointRef.local(restored.local_path), job) == []


@pytest.fixture
def flaky_s3(s3_endpoint, monkeypatch):
    """A second S3 endpoint this test can stop and restart (same in-process backend state)."""
    import boto3
    from moto.server import ThreadedMotoServer

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    port = free_port()
    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)]
    servers[0].start()
    url = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="flaky")

    def restart():
        servers.append(ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False))
        servers[-1].start()

    yield url, servers, restart
    servers[-1].stop()


def test_s3_outage_mid_upload_leaves_it_uncommitted_remotely_and_local_intact(flaky_s3):
    from fm_pipeline.storage.s3 import S3Store

    url, servers, restart = flaky_s3
    store = S3Store("s3://flaky/fm", endpoint_url=url, max_attempts=1, connect_timeout_s=0.5)
    put_file = store.put_file
    calls = []

    def put_then_outage(local, key):
        info = put_file(local, key)
        if not calls:
            servers[0].stop()  # the endpoint goes away after the first object
        calls.append(key)
        return info

    store.put_file = put_then_outage
    job, trainer, (result,) = _train_and_save(store)

    assert result.committed and not result.upload.committed
    assert "127.0.0.1" in result.upload.error
    local = CheckpointRef.local(result.path)
    assert validate(local, job) == []  # the local copy is intact and selectable
    assert read_marks(local)["upload"]["committed"] is False
    assert latest_valid(job, tiers=("local",), root=local_site.root_of(job)).found.step == 1

    restart()  # the endpoint is back: some files made it, the manifest did not
    keys = {i.key.rsplit("/", 1)[-1] for i in store.list("checkpoints/ckpt-test/")}
    assert keys and "manifest.json" not in keys
    remote = latest_valid(job, store=store, tiers=("store",), root=local_site.root_of(job))
    assert remote.found is None
    assert "manifest.json: missing" in remote.skipped_lines()[0]

    (report,) = sync_to_store(job.name, store, root=local_site.root_of(job.name))  # the retry commits it
    assert report.committed
    assert latest_valid(job, store=store, tiers=("store",), root=local_site.root_of(job)).found.step == 1
    assert read_marks(local)["upload"]["attempts"] == 2


def test_unreachable_store_still_finds_the_local_checkpoint():
    from fm_pipeline.storage.s3 import S3Store

    job, trainer, (result,) = _train_and_save(None, upload=False)
    dead = S3Store("s3://nobucket/x", endpoint_url="http://127.0.0.1:9", max_attempts=1,
                   connect_timeout_s=0.5)
    found = latest_valid(job, store=dead, root=local_site.root_of(job))
    assert found.found.step == 1 and found.found.is_local
    assert "127.0.0.1:9" in found.unreachable[0]
    fresh = Trainer(TinyLM())
    assert restore_latest(fresh.app_state, job, store=dead, root=local_site.root_of(job)).step == 1
