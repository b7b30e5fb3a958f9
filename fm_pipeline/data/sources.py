"""Corpus readers: turn a SourceSpec into raw documents, whatever the location and format.

Locations (`uri`): a local directory or file, an `s3://bucket/prefix` (endpoint from
FM_S3_ENDPOINT_URL), or `python-stdlib` (the .py files of this interpreter's standard
library, site-packages excluded). Formats: `text` (one document per file), `jsonl` (one per
line, `text_field`), `parquet` (one per row, `text_field`), `python-code` (.py files as
text), `python-docstrings` (the docstrings and comments of .py files, as prose); `auto`
picks by file extension. `glob` filters files by their path relative to the location
(`**` spans directories); hidden files are skipped.

Readers never decode: a document that cannot be read (not UTF-8, malformed JSON, a missing
field) comes back with a `problem`, which cleaning counts as its drop reason.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sysconfig
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.config import SourceSpec
from fm_pipeline.data.docstrings import extract_prose_many
from fm_pipeline.data.errors import DataError
from fm_pipeline.storage import StoreError, open_store

STDLIB_URI = "python-stdlib"
_EXT_FORMAT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_STDLIB_SKIP = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class RawDocument:
    doc_id: str
    content: bytes | str | None
    problem: str | None = None


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: `rel` is its path relative to the source location."""

    rel: str
    size: int
    read: Callable[[], bytes]
    target: str | None = None  # where a followed symlink leaving the source's root points


def list_source_files(source: SourceSpec, near=None) -> list[SourceFile]:
    """The files a source reads, sorted; DataError when the location is missing or empty.
    `near`: the mix's store; an s3:// source is opened on its S3 service (Site.s3_endpoint)."""
    pattern = source.glob or ("**/*.py" if _is_python(source) else "**/*")
    if source.uri.startswith("s3://"):
        files = _list_s3(source, pattern, near)
    else:
        root = _local_root(source)
        files = _list_local(root, pattern, skip=_STDLIB_SKIP if source.uri == STDLIB_URI else set(),
                            follow=source.symlinks == "follow", source_name=source.name)
    if not files:
        raise DataError(f"source {source.name!r}: no files match {pattern!r} under {source.uri}")
    return files


def fingerprint(files: list[SourceFile]) -> str:
    """Names and sizes of a source's files: changes when files are added, removed or resized."""
    h = hashlib.sha256()
    for f in files:  # a followed link's target is part of what was read
        h.update(f"{f.rel}\0{f.size}{chr(0) + f.target if f.target else ''}\n".encode())
    return h.hexdigest()[:16]


def iter_documents(source: SourceSpec, files: list[SourceFile]) -> Iterator[RawDocument]:
    fmt = source.format
    if source.uri == STDLIB_URI and fmt in ("auto", "text"):
        fmt = "python-code"
    if fmt == "python-docstrings":
        yield from _python_prose(files)
        return
    for f, data in _read_all(files):
        kind = fmt if fmt != "auto" else _EXT_FORMAT.get(Path(f.rel).suffix.lower(), "text")
        if kind == "jsonl":
            yield from _jsonl_documents(f.rel, data, source.text_field)
        elif kind == "parquet":
            yield from _parquet_documents(f.rel, data, source.text_field)
        elif data is None:
            yield RawDocument(f.rel, None, "unreadable")
        else:
            yield RawDocument(f.rel, data)


# --- locations -------------------------------------------------------------------------

def _is_python(source: SourceSpec) -> bool:
    return source.uri == STDLIB_URI or source.format in ("python-code", "python-docstrings")


def _local_root(source: SourceSpec) -> Path:
    if source.uri == STDLIB_URI:
        return Path(sysconfig.get_paths()["stdlib"])
    root = Path(source.uri.removeprefix("file://")).expanduser()
    if not root.exists():
        raise DataError(f"source {source.name!r}: {source.uri} does not exist")
    return root


def _glob_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def _list_local(root: Path, pattern: str, *, skip: set[str], follow: bool = False,
                source_name: str = "") -> list[SourceFile]:
    """Files under `root` matching `pattern`. A symlink whose target lies outside the root
    is refused (DataError naming it), or with `follow` read and recorded (`target`)."""
    if root.is_file():
        return [SourceFile(root.name, root.stat().st_size, root.read_bytes)]
    real_root = root.resolve()

    def outside(path: Path) -> str | None:
        """The target of a link under `path` that leaves the root, else None."""
        target = path.resolve()
        return None if target == real_root or real_root in target.parents else str(target)

    def refuse(rel: str, target: str) -> DataError:
        return DataError(
            f"source {source_name!r}: {rel} is a symlink to {target}, outside the source's "
            f"root {real_root}; remove it, or set symlinks: follow on the source to read "
            "it (the target is then recorded in the source's fingerprint)")
    match = _glob_regex(pattern).match
    # Walk only below the pattern's literal directories ("email/*.py" -> root/email), and
    # prune hidden and skipped directories instead of listing everything under them.
    literal = []
    for part in pattern.split("/")[:-1]:
        if any(c in part for c in "*?["):
            break
        literal.append(part)
    start = root.joinpath(*literal)
    files, walked = [], set()
    for dirpath, dirnames, filenames in os.walk(start, followlinks=follow):
        real = os.path.realpath(dirpath)
        if real in walked:  # a followed link back into what was already read: no loop
            dirnames[:] = []
            continue
        walked.add(real)
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        kept = []
        for d in dirnames:
            if d.startswith(".") or d in skip:
                continue
            link = Path(dirpath, d)
            if link.is_symlink() and (target := outside(link)) and not follow:
                raise refuse(d if rel_dir == "." else f"{rel_dir}/{d}", target)
            kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if name.startswith(".") or not match(rel):
                continue
            path = Path(dirpath, name)
            target = outside(path)
            if target and not follow:
                raise refuse(rel, target)
            if path.is_file():
                files.append(SourceFile(rel, path.stat().st_size, path.read_bytes, target))
    return sorted(files, key=lambda f: f.rel)


def _list_s3(source: SourceSpec, pattern: str, near) -> list[SourceFile]:
    store = open_store(source.uri, endpoint_url=getattr(near, "s3_endpoint", None))
    try:
        objects = store.list("")
    except StoreError as e:
        raise DataError(f"source {source.name!r}: cannot list {source.uri}: {e}") from None
    match = _glob_regex(pattern).match
    return [
        SourceFile(o.key, o.size, lambda key=o.key: store.get_bytes(key))
        for o in objects
        if match(o.key) and not any(p.startswith(".") for p in o.key.split("/"))
    ]


def _read_all(files: list[SourceFile]) -> Iterator[tuple[SourceFile, bytes | None]]:
    """File contents in order; remote reads overlap on a few threads."""

    def read(f: SourceFile) -> bytes | None:
        try:
            return f.read()
        except OSError:
            return None  # counted as an unreadable document

    with ThreadPoolExecutor(max_workers=8) as pool:
        yield from zip(files, pool.map(read, files))


# --- formats ---------------------------------------------------------------------------

def _jsonl_documents(rel: str, data: bytes | None, field: str) -> Iterator[RawDocument]:
    if data is None:
        yield RawDocument(rel, None, "unreadable")
        return
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        doc_id = f"{rel}:{lineno}"
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            yield RawDocument(doc_id, line, "not_utf8")
            continue
        except json.JSONDecodeError:
            yield RawDocument(doc_id, None, "malformed_json")
            continue
        text = record.get(field) if isinstance(record, dict) else None
        yield RawDocument(doc_id, text, None if isinstance(text, str) else "missing_field")


def _parquet_documents(rel: str, data: bytes | None, field: str) -> Iterator[RawDocument]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data), columns=[field]) if data is not None else None
    except (pa.ArrowException, KeyError, ValueError):
        table = None
    if table is None:
        yield RawDocument(rel, None, "unreadable")
        return
    for row, text in enumerate(table.column(field).to_pylist()):
        yield RawDocument(f"{rel}:{row}", text, None if isinstance(text, str) else "missing_field")


def _python_prose(files: list[SourceFile]) -> Iterator[RawDocument]:
    batch: list[tuple[str, bytes | None]] = []
    for f, data in _read_all(files):
        batch.append((f.rel, data))
    for rel, (text, problem) in zip((r for r, _ in batch), extract_prose_many([d for _, d in batch])):
        yield RawDocument(rel, text, problem)
