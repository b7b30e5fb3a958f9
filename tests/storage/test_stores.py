"""Both object stores keep the same contract: atomic puts, listing, deletes, verification."""

from __future__ import annotations

import pytest

from fm_pipeline.storage import ObjectNotFound, StoreError, open_store
from tests import local_site


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return local_site.site().open_store(f"s3://{bucket}/prefix")


def test_round_trip_list_delete(store, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(b"x" * 1000)
    store.put_file(src, "a/b/blob.bin")
    store.put_bytes(b"hello", "a/c.txt")
    assert [(i.key, i.size) for i in store.list("a/")] == [("a/b/blob.bin", 1000), ("a/c.txt", 5)]
    assert store.get_bytes("a/c.txt") == b"hello"
    out = store.get_file("a/b/blob.bin", tmp_path / "out" / "blob.bin")
    assert out.read_bytes() == src.read_bytes()
    assert store.delete_prefix("a/") == 1005
    assert store.list("a/") == [] and not store.exists("a/c.txt")


def test_missing_object_is_named(store, tmp_path):
    with pytest.raises(ObjectNotFound, match="nope.bin"):
        store.get_file("nope.bin", tmp_path / "x")


def test_keys_cannot_escape_the_root(store):
    with pytest.raises(StoreError, match="invalid object key"):
        store.put_bytes(b"", "../escape")


def test_s3_multipart_upload_verifies(s3_bucket, tmp_path):
    store = local_site.site().open_store(f"s3://{s3_bucket}/big")
    src = tmp_path / "big.bin"
    src.write_bytes(bytes(range(256)) * (40 << 12))  # 40 MiB: three 16 MiB parts
    info = store.put_file(src, "big.bin")
    assert info.size == src.stat().st_size
    assert store.get_file("big.bin", tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_unreachable_s3_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from fm_pipeline.storage.s3 import S3Store

    store = S3Store("s3://nobucket/x", endpoint_url="http://127.0.0.1:9", max_attempts=1,
                    connect_timeout_s=0.5)
    with pytest.raises(StoreError, match=r"cannot upload s3://nobucket/x/k .*127\.0\.0\.1:9"):
        store.put_bytes(b"1", "k")


def test_a_local_listing_skips_what_is_deleted_while_it_walks(tmp_path):
    """Seen in CI: the API listed a job's checkpoints in the store while retention deleted
    one; the walk met a directory that had just gone and the status request answered 500.
    A listing is a snapshot: what goes meanwhile is left out, what stays is listed."""
    import shutil
    import threading

    store = open_store(str(tmp_path / "store"))
    for i in range(3):
        store.put_bytes(b"x", f"ckpt/keep/f{i}")
    stop = threading.Event()

    def churn():  # another process's retention: checkpoints written, then deleted
        n = 0
        while not stop.is_set():
            n += 1
            for f in range(20):
                store.put_bytes(b"y" * 10, f"ckpt/step-{n}/shard-{f}")
            shutil.rmtree(tmp_path / "store" / "ckpt" / f"step-{n}")

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(300):
            keys = [i.key for i in store.list("ckpt/")]
            assert [k for k in keys if "/keep/" in k] == [f"ckpt/keep/f{i}" for i in range(3)]
    finally:
        stop.set()
        thread.join()
