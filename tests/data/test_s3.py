"""A whole mix through S3 on a loopback endpoint (moto's server): prepared into S3, read
from S3 sources, loaded through the local cache; S3 problems come back as clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fm_pipeline.data import CorruptShardError, MixLoader, mix_key, open_mix, prepare_mix
from fm_pipeline.data.manifest import manifest_key
from fm_pipeline.data.testing import small_job
from fm_pipeline.storage import StoreError, open_store
from fm_pipeline.storage.s3 import S3Store
from tests import local_site
from tests.data.conftest import make_job


def test_mix_round_trips_through_s3(s3_bucket, small_mix, fm_home, tmp_path):
    store = local_site.site().open_store(f"s3://{s3_bucket}/mixes")
    manifest = prepare_mix(small_job(), store)
    assert manifest.key == small_mix.key
    assert store.exists(manifest_key(manifest.key))
    mix = open_mix(store, manifest.key, cache_dir=local_site.site().data_cache(manifest.key))
    # Same spec, same bytes: the S3-prepared mix serves exactly the local mix's samples.
    assert np.array_equal(mix.samples(0, 64), small_mix.samples(0, 64))
    loader = MixLoader(mix, dp_rank=1, dp_size=2, micro_batch_size=2, global_batch_size=8, seq_len=32)
    assert np.array_equal(next(loader).numpy(), small_mix.samples(4, 4))
    assert mix.verify() > 0
    assert any((fm_home / "cache" / "data" / mix.key).rglob("*.bin"))  # shards cached locally

    victim = manifest.sources[0].shards[1]
    store.put_bytes(b"\x00\x01" * victim.tokens, victim.key)  # same size, other bytes
    with pytest.raises(CorruptShardError, match=victim.key):  # a machine without the cache
        open_mix(store, manifest.key, cache_dir=tmp_path / "other-node").verify()


def test_s3_prefix_as_a_jsonl_source(s3_bucket, tmp_path):
    docs = local_site.site().open_store(f"s3://{s3_bucket}/corpus")
    lines = [json.dumps({"text": (json.__doc__ or "")[i * 150:(i + 1) * 150]}) for i in range(6)]
    docs.put_bytes("\n".join(lines).encode(), "part-0.jsonl")
    docs.put_bytes(b"ignored", "notes/readme.md")
    job = make_job([{"name": "web", "uri": f"s3://{s3_bucket}/corpus", "glob": "*.jsonl", "weight": 1.0}])
    # The source is read on the site's S3 service, whichever store the mix goes to.
    manifest = prepare_mix(job, local_site.site().open_store(tmp_path / "store"))
    assert manifest.sources[0].documents.read == 6 and manifest.sources[0].train_tokens > 0


def test_unreachable_s3_is_a_clear_error_and_publishes_nothing(monkeypatch, tmp_path, text_dir):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    dead = S3Store("s3://nobucket/mixes", endpoint_url="http://127.0.0.1:9", max_attempts=1,
                   connect_timeout_s=0.5)
    job = make_job([{"name": "docs", "uri": str(text_dir), "weight": 1.0}])
    with pytest.raises(StoreError, match=r"s3://nobucket/mixes/data/.* at http://127\.0\.0\.1:9"):
        prepare_mix(job, dead)
    monkeypatch.setenv("FM_S3_ENDPOINT_URL", "http://127.0.0.1:9")  # the site's S3 service
    source_job = make_job([{"name": "web", "uri": "s3://nobucket/corpus", "weight": 1.0}])
    with pytest.raises(Exception, match=r"source 'web': cannot list s3://nobucket/corpus"):
        prepare_mix(source_job, local_site.site().open_store(tmp_path / "store"))
    assert not open_store(tmp_path / "store").exists(manifest_key(mix_key(source_job)))


def test_the_loader_fetches_the_shards_of_the_steps_ahead_from_s3(s3_bucket, small_mix,
                                                                   fm_home, tmp_path):
    """On a remote store the loader asks for the shards of the next `shard_lookahead` steps
    in the background: the same batches as without it, and the steps that follow find
    their shards fetched instead of downloading them themselves. A shard corrupted in the
    store is still reported by the step that reads it, naming it."""
    store = local_site.site().open_store(f"s3://{s3_bucket}/mixes")
    manifest = prepare_mix(small_job(), store)
    steps = 24

    def run(lookahead: int, cache: str):
        mix = open_mix(store, manifest.key, cache_dir=tmp_path / cache)
        loader = MixLoader(mix, dp_rank=0, dp_size=1, micro_batch_size=2,
                           global_batch_size=8, seq_len=32, shard_lookahead=lookahead)
        batches = [next(loader).numpy() for _ in range(steps)]
        loader.close()
        mix.close()
        return batches, mix.prefetch_stats

    plain, plain_stats = run(0, "plain")
    ahead, stats = run(8, "ahead")
    assert all(np.array_equal(a, b) for a, b in zip(plain, ahead))
    assert plain_stats["started"] == 0 and plain_stats["on_demand"] > 2
    assert stats["started"] > 0
    # Only what step 0 needs is fetched on demand (the prefetch starts with step 1).
    assert stats["on_demand"] < plain_stats["on_demand"]

    victim = manifest.sources[0].split_shards("train")[-1]
    store.put_bytes(b"\x00\x01" * victim.tokens, victim.key)  # same size, other bytes
    mix = open_mix(store, manifest.key, cache_dir=tmp_path / "corrupt")
    loader = MixLoader(mix, dp_rank=0, dp_size=1, micro_batch_size=2, global_batch_size=8,
                       seq_len=32, shard_lookahead=64)
    with pytest.raises(CorruptShardError, match=victim.key):
        for _ in range(4 * len(mix)):  # until a step reads the victim
            next(loader)
    loader.close()
    mix.close()
