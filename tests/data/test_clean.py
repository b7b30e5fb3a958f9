"""Cleaning drops what it should, says why, and dedups across sources."""

from __future__ import annotations

import unicodedata

from fm_pipeline.data.clean import DocumentFilter, normalize_text
from fm_pipeline.data.sources import RawDocument
from tests.data.conftest import clean_corpus, kept_texts


def test_normalisation_unifies_encodings_of_the_same_text():
    nfd = unicodedata.normalize("NFD", "café au lait")
    assert normalize_text(("\ufeff" + nfd + "\r\n").encode("utf-8")) == "café au lait"
    assert normalize_text("line one\r\nline two\rthree\x00\x07") == "line one\nline two\nthree"
    assert normalize_text("tabs\tstay") == "tabs\tstay"
    assert normalize_text(b"caf\xe9 latin-1") is None


def test_each_document_is_kept_or_dropped_with_its_reason():
    judge = DocumentFilter(min_chars=10, max_chars=40)
    cases = {
        RawDocument("ok", "a perfectly fine document"): None,
        RawDocument("short", "tiny"): "too_short",
        RawDocument("long", "x" * 41): "too_long",
        RawDocument("blank", "  \n\t "): "empty",
        RawDocument("latin1", "d\xe9j\xe0 vu, encoded wrong".encode("latin-1")): "not_utf8",
        RawDocument("surrogate", "a lone \ud800 surrogate here"): "invalid_unicode",
        RawDocument("bad-json", None, "malformed_json"): "malformed_json",
    }
    assert {d.doc_id: judge.judge(d)[1] for d in cases} == {d.doc_id: r for d, r in cases.items()}
    assert judge.judge(RawDocument("crlf", "a perfectly fine document\r\n"))[0] == \
        "a perfectly fine document"


def test_filters_and_dedup_drop_what_they_should(tmp_path):
    docs = ["a perfectly fine document", unicodedata.normalize("NFD", "a perfectly fine document"),
            "a perfectly fine document\r\n", "tiny", "x" * 41, "  \n\t ",
            "d\xe9j\xe0 vu, encoded wrong".encode("latin-1"), "another fine document here"]
    job, store, receipt = clean_corpus(tmp_path, {"s": docs}, min_chars=10, max_chars=40,
                                       heldout_fraction=0.0)
    assert kept_texts(job, store, "s") == ["a perfectly fine document", "another fine document here"]
    counts = receipt.sources["s"]
    assert counts.read == 8 and counts.kept == 2
    assert counts.dropped == {"duplicate": 2, "too_short": 1, "too_long": 1, "empty": 1,
                              "not_utf8": 1}
    assert receipt.examples["s"]["duplicate"] == "00001.txt"
    assert counts.chars_kept == len("a perfectly fine document") + len("another fine document here")


def test_dedup_spans_sources(tmp_path):
    job, store, receipt = clean_corpus(tmp_path, {"a": ["shared text", "only in a"],
                                                  "b": ["shared text", "only in b"]},
                                       min_chars=1, heldout_fraction=0.0)
    assert kept_texts(job, store, "b") == ["only in b"]
    assert receipt.sources["b"].dropped == {"duplicate": 1}
    assert kept_texts(job, store, "a") == ["shared text", "only in a"]


def test_heldout_split_depends_on_content_not_order(tmp_path):
    texts = [f"document number {i} with some words" for i in range(400)]

    def heldout(root, order):
        job, store, _ = clean_corpus(root, {"s": [texts[i] for i in order]}, min_chars=1,
                                     heldout_fraction=0.1)
        return set(kept_texts(job, store, "s", "heldout"))
    forward = heldout(tmp_path / "f", range(400))
    assert forward == heldout(tmp_path / "r", reversed(range(400)))
    assert 20 <= len(forward) <= 60  # ~10% of 400


def test_small_source_still_gets_one_heldout_document(tmp_path):
    job, store, receipt = clean_corpus(tmp_path, {"s": ["first text", "second text"]},
                                       min_chars=1, heldout_fraction=0.01)
    assert len(kept_texts(job, store, "s", "heldout")) == 1
    assert len(kept_texts(job, store, "s", "train")) == 1 and receipt.sources["s"].heldout == 1
