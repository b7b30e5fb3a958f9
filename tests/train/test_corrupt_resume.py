"""A corrupt newest checkpoint in both tiers: the next segment falls back to the previous one,
trains back up to the corrupt step and saves it again, valid, in both tiers; the corrupt
copies are set aside with their reason (never selected, never deleted), and the older valid
checkpoints are intact. One rank, the debug model, S3 on loopback with uploads on."""

from __future__ import annotations

import os

import pytest

from fm_pipeline.catalog import CheckpointRef, read_manifest, validate
from fm_pipeline.catalog.set_aside import list_set_aside
from fm_pipeline.catalog.refs import list_local, list_store, store_root
from fm_pipeline.config import load_job
from fm_pipeline.data.testing import build_small_mix
from fm_pipeline.rundir.records import read_records
from tests.train.launch import env_for, failure, train, write_job
from tests import local_site

pytestmark = pytest.mark.slow

JOB = "corrupt-newest"


def _flip_a_byte(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0xFF
    return bytes(out)


def test_training_past_a_corrupt_newest_checkpoint_replaces_it_and_keeps_the_rest(
        fm_home, s3_bucket, tmp_path):
    store_uri = f"s3://{s3_bucket}/fm"
    env = env_for(fm_home, FM_STORE_URI=store_uri,
                  FM_S3_ENDPOINT_URL=os.environ["FM_S3_ENDPOINT_URL"])
    path = write_job(tmp_path, JOB, nproc=1, **{
        "training.steps": 30, "training.segment_steps": 30, "checkpoint.every_steps": 10,
        "checkpoint.keep_last": 3, "checkpoint.upload": True})
    job, store = load_job(path), local_site.site().open_store(store_uri)
    build_small_mix(job, store=store)
    root = fm_home / "runs" / JOB / "checkpoints"

    out = train(fm_home, path, env=env)
    assert out.returncode == 0, failure(out)
    first30 = read_manifest(CheckpointRef.local(root / "step-00000030"))
    before = {tier: {r.step: r.read_bytes("manifest.json") for r in refs}
              for tier, refs in (("local", list_local(root)),
                                 ("store", list_store(store, store_root(JOB))))}
    assert sorted(before["local"]) == sorted(before["store"]) == [10, 20, 30]

    # Step 30 corrupt in both tiers: same sizes, one byte flipped in its largest shard.
    shard = max((f for f in first30.files if f.path.endswith(".distcp")), key=lambda f: f.size)
    local_shard = root / "step-00000030" / shard.path
    local_shard.write_bytes(_flip_a_byte(local_shard.read_bytes()))
    key = f"{store_root(JOB)}/step-00000030/{shard.path}"
    store.put_bytes(_flip_a_byte(store.get_bytes(key)), key)

    out = train(fm_home, path, "--end-step", "30", env=env)
    assert out.returncode == 0, failure(out)
    segment = read_records(fm_home / "runs" / JOB / "segments.jsonl", "segment")[-1]
    assert segment["start_step"] == 20 and segment["end_step"] == 30, segment

    # A new, valid step 30 in both tiers: the same weights as the first (exact resume).
    for ref in (CheckpointRef.local(root / "step-00000030"),
                CheckpointRef.remote(store, f"{store_root(JOB)}/step-00000030")):
        assert validate(ref, job) == [], ref.location
        again = read_manifest(ref)
        assert again.created_at != first30.created_at
        assert again.probe.loss == first30.probe.loss
    # The older valid checkpoints are untouched, in both tiers.
    for tier, refs in (("local", list_local(root)), ("store", list_store(store, store_root(JOB)))):
        steps = {r.step: r for r in refs}
        assert sorted(steps) == [10, 20, 30], tier
        for step in (10, 20):
            assert steps[step].read_bytes("manifest.json") == before[tier][step], (tier, step)
            assert validate(steps[step], job) == [], (tier, step)
    # The corrupt copies are set aside with the reason, every file kept.
    aside = list_set_aside(JOB, store=store, root=local_site.root_of(JOB))
    assert sorted((e.ref.step, e.ref.is_local, e.kind) for e in aside) == [
        (30, False, "invalid"), (30, True, "invalid")]
    for entry in aside:
        assert shard.path in entry.reason and "corrupt" in entry.reason, entry.reason
        assert entry.ref.read_bytes("manifest.json") == before[
            "local" if entry.ref.is_local else "store"][30]
