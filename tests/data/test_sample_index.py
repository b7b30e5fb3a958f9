"""The global sample index in shards: built one shard at a time with every source spread
evenly over them, no window twice in a pass, and read through its shards exactly as the
index they concatenate to, at any sample range."""

from __future__ import annotations

import numpy as np
import pytest

from fm_pipeline.data import open_mix
from fm_pipeline.data.pipeline import publish_stage
from fm_pipeline.data.sample_index import (
    build_sample_index,
    index_shards,
    permute,
    samples_per_source,
    shard_plan,
    split_entries,
)
from tests.data.conftest import copy_mix


@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 1000, 123_457])
def test_the_window_order_is_a_permutation(n):
    out = permute(np.arange(n), n, key=(7, 1))
    assert np.array_equal(np.sort(out), np.arange(n))
    if n > 1000:  # and not the identity or a shift: neighbours land far apart
        assert np.median(np.abs(np.diff(out))) > n / 10


def test_shards_spread_every_source_evenly_and_never_repeat_a_window():
    windows = {"web": 50_000, "code": 9_000, "math": 700}
    counts = samples_per_source(windows, {"web": 0.7, "code": 0.25, "math": 0.05})
    shards = list(index_shards(counts, windows, seed=3, shard_samples=2_000))
    plan = shard_plan(counts, shard_samples=2_000)
    assert len(shards) == len(plan) > 5
    assert max(len(s) for s in shards) <= 2_000 + len(counts)
    for shard, row in zip(shards, plan, strict=True):
        ids, _ = split_entries(shard)
        assert np.array_equal(np.bincount(ids, minlength=3), row)
        assert np.all(np.abs(row / row.sum() - plan.sum(0) / plan.sum()) < 0.01)
    whole = np.concatenate(shards)
    ids, win = split_entries(whole)
    for source_id, name in enumerate(windows):
        mine = win[ids == source_id]
        assert len(mine) == counts[name] and len(np.unique(mine)) == counts[name]
        assert mine.max() < windows[name]
    assert np.array_equal(whole, build_sample_index(counts, windows, seed=3, shard_samples=2_000))
    other = build_sample_index(counts, windows, seed=4, shard_samples=2_000)
    assert not np.array_equal(whole, other)


def test_a_mix_reads_its_index_through_shards_as_the_whole_index(small_mix, tmp_path,
                                                                   monkeypatch):
    """The small mix published with index shards of 64 samples: every sample range (inside
    a shard, across shards, past one pass) reads what the concatenated shards hold, and
    verify re-hashes each shard; a damaged shard is named."""
    from fm_pipeline.data import sample_index
    from fm_pipeline.data.errors import CorruptShardError
    from fm_pipeline.data.testing import small_job

    mix = copy_mix(small_mix, tmp_path)
    store, key = mix.store, mix.key
    store.delete(f"data/{key}/manifest.json")  # keep the stages' outputs, drop the publication
    for info in store.list(f"data/{key}/sample_index/"):
        store.delete(info.key)
    monkeypatch.setattr(sample_index, "INDEX_SHARD_SAMPLES", 64)
    manifest = publish_stage(small_job(), store)
    parts = manifest.sample_index.parts()
    assert len(parts) > 3 and all(p.samples <= 64 + 2 for p in parts)
    resharded = open_mix(store, key)
    whole = np.concatenate([np.frombuffer(store.get_bytes(p.key), "<i8") for p in parts])
    n = len(whole)
    assert n == manifest.sample_index.samples
    for start, count in ((0, 5), (60, 10), (n - 3, 3), (n - 2, 7)):
        got = resharded.index_entries(start, count)
        if start + count <= n:
            assert np.array_equal(got, whole[start:start + count])
        else:  # the next pass: the same entries in another order
            assert set(got.tolist()) <= set(whole.tolist())
    assert resharded.samples(60, 10).shape == (10, manifest.window)
    resharded.verify()
    path = store.local_path(parts[2].key)
    data = bytearray(path.read_bytes())
    data[8] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=parts[2].key.split("/")[-1]):
        open_mix(store, key).verify()
