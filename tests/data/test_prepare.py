"""Preparing a mix end to end: integrity of what is published, atomic publication,
idempotent re-runs, and clear errors for bad input that leave nothing half-published."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from fm_pipeline.config import JobSpecError
from fm_pipeline.data import CorruptShardError, DataError, mix_key, open_mix, pipeline, prepare_mix
from fm_pipeline.data.corpus import iter_clean_texts
from fm_pipeline.data.manifest import clean_receipt_key, manifest_key, shards_receipt_key
from fm_pipeline.data.testing import small_job
from fm_pipeline.storage import open_store
from tests.data.conftest import copy_mix, make_job


def test_shard_checksums_and_counts_match_the_manifest(small_mix):
    m = small_mix.manifest
    assert m.dtype == "uint16" and m.window == m.seq_len + 1
    for source in m.sources:
        assert len(source.split_shards("train")) > 1  # small shards: multi-shard paths run
        for split, expected in (("train", source.train_tokens), ("heldout", source.heldout_tokens)):
            total = 0
            for i, entry in enumerate(source.split_shards(split)):
                data = small_mix.store.get_bytes(entry.key)
                assert hashlib.sha256(data).hexdigest() == entry.sha256
                tokens = np.frombuffer(data, dtype="<u2")
                assert len(tokens) == entry.tokens == len(data) // 2 > 0
                assert tokens.max() < m.vocab_size
                if i < len(source.split_shards(split)) - 1:  # all but the last hold whole windows
                    assert entry.tokens % m.window == 0
                total += entry.tokens
            assert total == expected
        assert source.train_windows == source.train_tokens // m.window
        assert source.epochs == pytest.approx(source.samples * m.window / source.train_tokens, rel=1e-5)
    assert sum(s.samples for s in m.sources) == len(small_mix)


def test_samples_are_real_text_of_their_source(small_mix):
    corpus = {s: "".join(t for batch in iter_clean_texts(small_mix.store, small_mix.key, s) for t in batch)
              for s in small_mix.source_names}
    rows = small_mix.samples(0, 20)
    for row, source in zip(rows, small_mix.sample_sources(0, 20)):
        text = small_mix.decode(row)
        longest = max(text.split("<|endoftext|>"), key=len)
        assert longest in corpus[source], (source, longest[:80])


def test_tokenizer_is_stored_for_the_trainer(small_mix):
    raw = small_mix.store.get_bytes(f"data/{small_mix.key}/tokenizer.json")
    tok = Tokenizer.from_str(raw.decode())
    assert tok.get_vocab_size() == small_mix.manifest.tokenizer.vocab_size <= small_mix.vocab_size
    ids = tok.encode("def parse(message): return email.message_from_string(message)").ids
    assert ids and max(ids) < small_mix.vocab_size
    assert tok.decode(ids) == "def parse(message): return email.message_from_string(message)"


def test_rerun_is_idempotent_and_fast(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    shard = mix.store.local_path(mix.manifest.sources[0].shards[0].key)
    before = shard.stat().st_mtime_ns
    again = prepare_mix(small_job(), mix.store)
    assert again == mix.manifest
    assert shard.stat().st_mtime_ns == before


def test_failed_publish_leaves_nothing_published_and_resumes(tmp_path, monkeypatch):
    job = small_job()
    store = open_store(tmp_path / "store")
    key = mix_key(job)

    real = pipeline.index_shards

    def boom(*args, **kwargs):  # the first index shard is written, then the disk is full
        yield next(real(*args, **kwargs))
        raise RuntimeError("disk full while writing the index")

    monkeypatch.setattr(pipeline, "index_shards", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_mix(job, store)
    assert not store.exists(manifest_key(key))
    with pytest.raises(DataError, match=f"data mix {key} is not published"):
        open_mix(store, key)
    assert store.exists(shards_receipt_key(key))  # finished stages are kept ...
    shard = store.local_path(store.list(f"data/{key}/shards/code/")[0].key)
    before = shard.stat().st_mtime_ns
    monkeypatch.undo()
    manifest = prepare_mix(job, store)  # ... and reused by the next run
    assert manifest.key == key and shard.stat().st_mtime_ns == before
    assert open_mix(store, key).samples(0, 2).shape == (2, job.training.seq_len + 1)


def test_corrupted_or_truncated_shards_are_named(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    first, second = mix.manifest.sources[1].shards[:2]
    path = mix.store.local_path(first.key)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    mix.store.local_path(second.key).write_bytes(path.read_bytes()[:-2])
    fresh = open_mix(mix.store, mix.key)
    with pytest.raises(CorruptShardError, match=f"corrupted shard {first.key}: sha256"):
        fresh.verify()
    with pytest.raises(CorruptShardError, match=f"corrupted shard {second.key}: .* bytes, manifest says"):
        open_mix(mix.store, mix.key)._gather("prose", "train", np.array([first.tokens // mix.window]))


def test_weights_that_do_not_sum_to_one_name_the_field():
    with pytest.raises(JobSpecError, match=r"data: source weights must sum to 1, got 1.2 \(a=0.6, b=0.6\)"):
        make_job([{"name": "a", "uri": "x", "weight": 0.6}, {"name": "b", "uri": "y", "weight": 0.6}])


def test_unreadable_source_is_an_error_and_publishes_nothing(tmp_path, text_dir):
    bad = tmp_path / "latin1"
    bad.mkdir()
    for i in range(2):
        (bad / f"{i}.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e, encoded as latin-1".encode("latin-1"))
    job = make_job([{"name": "good", "uri": str(text_dir), "weight": 0.5},
                    {"name": "bad", "uri": str(bad), "weight": 0.5}])
    store = open_store(tmp_path / "store")
    with pytest.raises(DataError, match=r"source 'bad' .* no usable documents: read 2, dropped not_utf8=2 \(e.g. 0.txt\)"):
        prepare_mix(job, store)
    assert not store.exists(manifest_key(mix_key(job))) and not store.exists(clean_receipt_key(mix_key(job)))


def test_a_few_non_utf8_files_are_skipped_and_counted(tmp_path, text_dir):
    (text_dir / "zz-latin1.txt").write_bytes("na\xefve caf\xe9 text".encode("latin-1"))
    job = make_job([{"name": "docs", "uri": str(text_dir), "weight": 1.0}], heldout_fraction=0.0)
    manifest = prepare_mix(job, open_store(tmp_path / "store"))
    assert manifest.sources[0].documents.dropped == {"not_utf8": 1}
    assert manifest.sources[0].documents.kept == 5


def test_a_record_that_cannot_be_encoded_is_dropped_and_named_not_fatal(tmp_path, text_dir):
    """A JSONL record whose text holds a lone surrogate ("\\ud800" is valid JSON but no
    Unicode text) and one that is not UTF-8: both dropped, counted, named file:line."""
    import json as json_module

    lines = [json_module.dumps({"text": doc}) for doc in
             (json_module.__doc__, json_module.dumps.__doc__, json_module.loads.__doc__)]
    lines.insert(1, '{"text": "half a pair \\ud800 of surrogates, long enough to keep"}')
    data = "\n".join(lines).encode() + b"\n" + b'{"text": "caf\xe9 au lait, not utf-8"}\n'
    (tmp_path / "feed").mkdir()
    (tmp_path / "feed" / "records.jsonl").write_bytes(data)
    job = make_job([{"name": "feed", "uri": str(tmp_path / "feed"), "weight": 1.0}],
                   heldout_fraction=0.0)
    store = open_store(tmp_path / "store")
    manifest = prepare_mix(job, store)
    counts = manifest.sources[0].documents
    assert counts.dropped == {"invalid_unicode": 1, "not_utf8": 1} and counts.kept == 3
    receipt = json.loads(store.get_bytes(clean_receipt_key(mix_key(job))))
    assert receipt["examples"]["feed"] == {"invalid_unicode": "records.jsonl:2",
                                           "not_utf8": "records.jsonl:5"}


def test_changed_sources_need_force(tmp_path, text_dir):
    job = make_job([{"name": "docs", "uri": str(text_dir), "weight": 1.0}])
    store = open_store(tmp_path / "store")
    first = prepare_mix(job, store)
    (text_dir / "extra.txt").write_text(json.__doc__ * 2)
    with pytest.raises(DataError, match="source 'docs' .* changed since mix .* re-run with force"):
        prepare_mix(job, store)
    rebuilt = prepare_mix(job, store, force=True)
    assert rebuilt.sources[0].documents.kept == first.sources[0].documents.kept + 1


def test_source_too_small_for_one_window_is_named(tmp_path, text_dir):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "note.txt").write_text(json.dumps.__doc__[:200])
    job = make_job([{"name": "docs", "uri": str(text_dir), "weight": 0.5},
                    {"name": "note", "uri": str(tmp_path / "one"), "weight": 0.5}],
                   seq_len=256, shard_tokens=1024, heldout_fraction=0.0)
    with pytest.raises(DataError, match=r"source\(s\) note have fewer train tokens than one sample window"):
        prepare_mix(job, open_store(tmp_path / "store"))


def test_vocab_smaller_than_the_byte_alphabet_is_named(tmp_path, text_dir):
    job = make_job([{"name": "docs", "uri": str(text_dir), "weight": 1.0}], vocab_size=200)
    with pytest.raises(DataError, match=r"model.vocab_size \(200\) must be >= 257"):
        prepare_mix(job, open_store(tmp_path / "store"))


def test_pipelined_encoding_equals_encoding_everything_at_once(small_mix):
    from fm_pipeline.data.tokenizer import encode_documents, encode_stream

    tok = small_mix.tokenizer()
    texts = [t for batch in iter_clean_texts(small_mix.store, small_mix.key, "prose") for t in batch]
    batches = [texts[i:i + 5] for i in range(0, len(texts), 5)]
    streamed = list(encode_stream(tok, batches, eos=0, dtype=np.uint16))
    assert [docs for _, docs in streamed] == [len(b) for b in batches]
    whole = encode_documents(tok, texts, eos=0, dtype=np.uint16)
    assert np.array_equal(np.concatenate([ids for ids, _ in streamed]), whole)
    assert (whole == 0).sum() == len(texts)  # one <|endoftext|> after each document


def test_literal_eos_marker_in_a_document_stays_text(tmp_path, text_dir):
    (text_dir / "about-tokenizers.txt").write_text(
        "GPT-2 separates documents with the literal marker <|endoftext|> between them.")
    job = make_job([{"name": "docs", "uri": str(text_dir), "weight": 1.0}], heldout_fraction=0.0)
    store = open_store(tmp_path / "store")
    manifest = prepare_mix(job, store)
    tokens = np.concatenate([np.frombuffer(store.get_bytes(s.key), dtype="<u2")
                             for s in manifest.sources[0].shards])
    assert (tokens == manifest.tokenizer.eos_id).sum() == manifest.sources[0].documents.kept == 6
