"""Cleaning drops what it should, says why, and dedups across sources."""

from __future__ import annotations

import unicodedata

from fm_pipeline.data.clean import Cleaner, normalize_text
from fm_pipeline.data.sources import RawDocument


def test_normalisation_unifies_encodings_of_the_same_text():
    nfd = unicodedata.normalize("NFD", "café au lait")
    assert normalize_text(("\ufeff" + nfd + "\r\n").encode("utf-8")) == "café au lait"
    assert normalize_text("line one\r\nline two\rthree\x00\x07") == "line one\nline two\nthree"
    assert normalize_text("tabs\tstay") == "tabs\tstay"
    assert normalize_text(b"caf\xe9 latin-1") is None


def test_filters_and_dedup_drop_what_they_should():
    cleaner = Cleaner(min_chars=10, max_chars=40, heldout_fraction=0.0)
    docs = [
        RawDocument("ok", "a perfectly fine document"),
        RawDocument("same-after-nfc", unicodedata.normalize("NFD", "a perfectly fine document")),
        RawDocument("crlf-copy", "a perfectly fine document\r\n"),
        RawDocument("short", "tiny"),
        RawDocument("long", "x" * 41),
        RawDocument("blank", "  \n\t "),
        RawDocument("latin1", "d\xe9j\xe0 vu, encoded wrong".encode("latin-1")),
        RawDocument("bad-json", None, "malformed_json"),
        RawDocument("other", "another fine document here"),
    ]
    out = cleaner.clean_source("s", docs)
    assert [d.doc_id for d in out.documents] == ["ok", "other"]
    counts = out.counts()
    assert counts.read == 9 and counts.kept == 2
    assert counts.dropped == {"duplicate": 2, "too_short": 1, "too_long": 1, "empty": 1,
                              "not_utf8": 1, "malformed_json": 1}
    assert out.examples["duplicate"] == "same-after-nfc"
    assert counts.chars_kept == len("a perfectly fine document") + len("another fine document here")


def test_dedup_spans_sources():
    cleaner = Cleaner(min_chars=1, max_chars=100, heldout_fraction=0.0)
    cleaner.clean_source("a", [RawDocument("a1", "shared text"), RawDocument("a2", "only in a")])
    b = cleaner.clean_source("b", [RawDocument("b1", "shared text"), RawDocument("b2", "only in b")])
    assert [d.doc_id for d in b.documents] == ["b2"] and b.counts().dropped == {"duplicate": 1}


def test_heldout_split_depends_on_content_not_order():
    texts = [f"document number {i} with some words" for i in range(400)]
    def heldout(order):
        out = Cleaner(min_chars=1, max_chars=100, heldout_fraction=0.1).clean_source(
            "s", [RawDocument(str(i), texts[i]) for i in order])
        return {d.text for d in out.documents if d.split == "heldout"}
    forward = heldout(range(400))
    assert forward == heldout(reversed(range(400)))
    assert 20 <= len(forward) <= 60  # ~10% of 400


def test_small_source_still_gets_one_heldout_document():
    out = Cleaner(min_chars=1, max_chars=100, heldout_fraction=0.01).clean_source(
        "s", [RawDocument("1", "first text"), RawDocument("2", "second text")])
    assert sorted(d.split for d in out.documents) == ["heldout", "train"]
