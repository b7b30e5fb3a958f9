"""Readers: local text/JSONL/parquet, Python sources and docstrings; missing or empty
locations are named in the error."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fm_pipeline.config import SourceSpec
from fm_pipeline.data import DataError
from fm_pipeline.data.docstrings import extract_prose
from fm_pipeline.data.sources import iter_documents, list_source_files


def read(source: SourceSpec):
    return list(iter_documents(source, list_source_files(source)))


def spec(uri, **kw):
    return SourceSpec(name="s", uri=str(uri), weight=1.0, **kw)


def test_text_directory_with_glob_skips_hidden_files(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("beta")
    (tmp_path / "sub" / "c.md").write_text("gamma")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "d.txt").write_text("secret")
    assert [(d.doc_id, d.content) for d in read(spec(tmp_path, glob="**/*.txt"))] == [
        ("a.txt", b"alpha"), ("sub/b.txt", b"beta")]
    assert [d.doc_id for d in read(spec(tmp_path, glob="sub/*"))] == ["sub/b.txt", "sub/c.md"]


def test_jsonl_lines_with_problems_are_flagged(tmp_path):
    lines = [json.dumps({"text": "first"}).encode(), b"{not json", json.dumps({"body": "x"}).encode(),
             b'{"text": "caf\xe9"}', json.dumps({"text": "last"}).encode()]
    (tmp_path / "docs.jsonl").write_bytes(b"\n".join(lines) + b"\n\n")
    docs = read(spec(tmp_path))
    assert [(d.doc_id, d.problem) for d in docs] == [
        ("docs.jsonl:1", None), ("docs.jsonl:2", "malformed_json"), ("docs.jsonl:3", "missing_field"),
        ("docs.jsonl:4", "not_utf8"), ("docs.jsonl:5", None)]
    assert docs[-1].content == "last"


def test_parquet_rows_and_unreadable_files(tmp_path):
    pq.write_table(pa.table({"body": ["one", None, "three"]}), tmp_path / "t.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    docs = read(spec(tmp_path, text_field="body"))
    assert [(d.doc_id, d.content, d.problem) for d in docs] == [
        ("broken.parquet", None, "unreadable"), ("t.parquet:0", "one", None),
        ("t.parquet:1", None, "missing_field"), ("t.parquet:2", "three", None)]


def test_python_docstrings_and_comments_become_prose():
    source = b'''#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""Module summary."""

# A comment block that
# spans two lines.
class Parser:
    """Parses things."""

    def run(self):  # trailing comments are code, not prose
        """Run it."""
        # ---------------------------
        return 1
'''
    prose, problem = extract_prose(source)
    assert problem is None
    assert prose.split("\n\n") == ["Module summary.", "Parses things.", "Run it.",
                                   "A comment block that spans two lines."]
    assert extract_prose(b"def broken(:\n") == (None, "syntax_error")
    assert extract_prose("caf\xe9 = 1".encode("latin-1")) == (None, "not_utf8")


def test_stdlib_source_reads_this_interpreters_library():
    files = list_source_files(spec("python-stdlib", format="python-code", glob="json/*.py"))
    assert "json/decoder.py" in [f.rel for f in files]
    assert all(not f.rel.startswith("site-packages") for f in files)


def test_missing_and_empty_locations_are_named(tmp_path):
    with pytest.raises(DataError, match=r"source 's': .*/nowhere does not exist"):
        list_source_files(spec(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"source 's': no files match '\*\*/\*.txt' under"):
        list_source_files(spec(tmp_path / "empty", glob="**/*.txt"))


def test_a_symlink_leaving_the_source_root_is_refused_or_followed_and_recorded(tmp_path):
    from fm_pipeline.data.sources import fingerprint

    root, outside = tmp_path / "corpus", tmp_path / "private"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.txt").write_text("alpha")
    (outside / "secret.txt").write_text("not part of the corpus")
    (root / "inside.txt").symlink_to(root / "a.txt")  # stays inside: read as usual
    (root / "sub" / "leak.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(DataError) as refused:
        read(spec(root))
    message = str(refused.value)
    assert "sub/leak.txt is a symlink to" in message and str(outside / "secret.txt") in message
    assert "symlinks: follow" in message

    followed = list_source_files(spec(root, symlinks="follow"))
    assert [(f.rel, f.target) for f in followed] == [
        ("a.txt", None), ("inside.txt", None), ("sub/leak.txt", str(outside / "secret.txt"))]
    # The target is part of what the source read: another target is another fingerprint.
    (outside / "other.txt").write_text("not part of the corpus")
    (root / "sub" / "leak.txt").unlink()
    (root / "sub" / "leak.txt").symlink_to(outside / "other.txt")
    assert fingerprint(list_source_files(spec(root, symlinks="follow"))) != fingerprint(followed)

    # A linked directory that leaves the root is refused the same way (it was skipped).
    (root / "sub" / "leak.txt").unlink()
    (root / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(DataError, match="linked is a symlink to"):
        read(spec(root))
    assert {f.rel for f in list_source_files(spec(root, symlinks="follow"))} >= {
        "linked/secret.txt", "linked/other.txt"}
