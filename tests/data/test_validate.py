"""The data-quality checks pass on a good mix and fail, naming the problem, on bad data."""

from __future__ import annotations

import json

import numpy as np

from fm_pipeline.data.corpus import ShardsReceipt, read_receipt, write_receipt
from fm_pipeline.data.manifest import ShardEntry, manifest_key, shards_receipt_key
from fm_pipeline.data.mix import open_mix
from fm_pipeline.data.shards import encode_shard
from fm_pipeline.data.validate import check_data_mix, check_token_shards, validate_published
from tests.data.conftest import copy_mix


def by_name(outcomes):
    return {o.name: o for o in outcomes}


def test_every_check_passes_on_a_good_mix(small_mix):
    outcomes = by_name(validate_published(small_mix.store, small_mix.manifest))
    assert set(outcomes) == {"dedup_ratio", "filter_drop_rates", "tokenizer_fits_model_vocab",
                             "token_ids_below_vocab", "shards_within_token_limit",
                             "no_empty_shards", "weights_sum_to_one", "source_counts_match_manifest"}
    assert all(o.passed for o in outcomes.values()), [o for o in outcomes.values() if not o.passed]
    assert outcomes["dedup_ratio"].metadata["dedup_ratio"] == 0.0


def _plant_shard(mix, tokens: np.ndarray) -> ShardsReceipt:
    store = mix.store
    receipt = read_receipt(store, shards_receipt_key(mix.key), ShardsReceipt)
    data, digest = encode_shard(tokens.astype(np.uint16))
    key = f"data/{mix.key}/shards/code/train-99999.bin"
    store.put_bytes(data, key)
    extra = ShardEntry(key=key, split="train", tokens=len(tokens), bytes=len(data), sha256=digest)
    shards = {**receipt.shards, "code": [*receipt.shards["code"], extra]}
    planted = receipt.model_copy(update={"shards": shards})
    write_receipt(store, shards_receipt_key(mix.key), planted)
    return planted


def test_out_of_vocab_ids_fail_and_name_the_shard(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    receipt = _plant_shard(mix, np.array([1, 2, mix.vocab_size + 7], dtype=np.uint16))
    out = by_name(check_token_shards(mix.store, receipt, vocab_size=mix.vocab_size, sources=mix.source_names))
    assert not out["token_ids_below_vocab"].passed
    assert "train-99999.bin" in out["token_ids_below_vocab"].description
    assert out["no_empty_shards"].passed


def test_empty_shards_fail(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    receipt = _plant_shard(mix, np.zeros(0, dtype=np.uint16))
    out = by_name(check_token_shards(mix.store, receipt, vocab_size=mix.vocab_size, sources=mix.source_names))
    assert not out["no_empty_shards"].passed and "1 empty" in out["no_empty_shards"].description


def test_a_shard_above_the_token_limit_fails_and_is_named(small_mix, tmp_path):
    capacity = read_receipt(small_mix.store, shards_receipt_key(small_mix.key),
                            ShardsReceipt).capacity

    def limit_check(where, tokens):
        mix = copy_mix(small_mix, tmp_path / where)
        receipt = _plant_shard(mix, np.ones(tokens, dtype=np.uint16))
        return by_name(check_token_shards(mix.store, receipt, vocab_size=mix.vocab_size,
                                          sources=mix.source_names))["shards_within_token_limit"]

    assert limit_check("full", capacity).passed
    over = limit_check("over", capacity + 1)
    assert not over.passed and over.metadata["over_limit"] == 1
    assert f"train-99999.bin ({capacity + 1})" in over.description
    assert f"limit {capacity}" in over.description


def test_manifest_that_disagrees_with_the_data_fails(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    raw = json.loads(mix.store.get_bytes(manifest_key(mix.key)))
    raw["sources"][0]["samples"] += 5  # the index does not hold these
    raw["sources"][0]["weight"], raw["sources"][1]["weight"] = 0.7, 0.5
    mix.store.put_bytes(json.dumps(raw).encode(), manifest_key(mix.key))
    out = by_name(check_data_mix(mix.store, open_mix(mix.store, mix.key).manifest))
    assert not out["weights_sum_to_one"].passed and "sum to 1.2" in out["weights_sum_to_one"].description
    assert not out["source_counts_match_manifest"].passed


def test_corrupt_shard_fails_the_counts_check(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    victim = mix.manifest.sources[1].shards[0]
    path = mix.store.local_path(victim.key)
    path.write_bytes(bytes(reversed(path.read_bytes())))
    out = by_name(check_data_mix(mix.store, mix.manifest))
    assert not out["source_counts_match_manifest"].passed
    assert victim.key in out["source_counts_match_manifest"].description
