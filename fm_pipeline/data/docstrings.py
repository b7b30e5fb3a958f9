"""Prose from Python source: the docstrings (module, class, function) and comment blocks.

Parsing with `ast` costs ~10 ms per 20 kB file, so files are parsed on a process pool.
A file that is not UTF-8 or does not parse comes back with its problem instead of text.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor

_COMMENT = re.compile(r"^[ \t]*#(.*)$")
_PRAGMA = re.compile(r"^(!|\s*-\*-|\s*(type|noqa|pragma|pylint|fmt|isort|mypy)\s*:)")
_LETTERS = re.compile(r"[A-Za-z]{2}")
_POOL_MIN_FILES = 64  # below this a pool costs more than it saves


def extract_prose(source: bytes | str | None) -> tuple[str | None, str | None]:
    """(prose, None) or (None, problem) for one Python file."""
    if source is None:
        return None, "unreadable"
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8-sig")
        except UnicodeDecodeError:
            return None, "not_utf8"
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None, "syntax_error"
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                parts.append(doc)
    parts.extend(_comment_blocks(source))
    return "\n\n".join(parts), None


def _comment_blocks(source: str) -> list[str]:
    """Consecutive full-line comments joined into paragraphs; pragmas and rulers dropped."""
    blocks, current = [], []
    for line in source.splitlines():
        m = _COMMENT.match(line)
        text = m.group(1).strip() if m else None
        if text is not None and not _PRAGMA.match(m.group(1)) and _LETTERS.search(text):
            current.append(text)
            continue
        if current and text is None:
            blocks.append(" ".join(current))
            current = []
    if current:
        blocks.append(" ".join(current))
    return blocks


def extract_prose_many(sources: list[bytes | str | None]) -> list[tuple[str | None, str | None]]:
    """`extract_prose` over many files, in order, on all cores when it pays."""
    workers = min(os.cpu_count() or 1, 8)
    if workers < 2 or len(sources) < _POOL_MIN_FILES:
        return [extract_prose(s) for s in sources]
    # fork starts workers in milliseconds and works from any __main__ (stdin scripts too);
    # the workers only parse text, never touching locks the parent's threads may hold.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
        return list(pool.map(extract_prose, sources, chunksize=max(1, len(sources) // (workers * 8))))
