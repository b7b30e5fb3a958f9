"""Durable local writes: a file is whole or absent, and survives a crash once written.

    atomic_write(path, data)   # temp file in the same directory, fsync, rename, fsync dir
    fsync_dir(path)            # make created and renamed entries of a directory durable
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created and renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Whole file or nothing, durable once this returns. A unique temporary name per call, so
    concurrent writers never share one; `mode`: the file's permissions (e.g. 0o600)."""
    atomic_write_with(path, lambda f: f.write(data), mode=mode)


def atomic_write_with(path: Path, write, *, mode: int | None = None) -> None:
    """atomic_write for a body that `write(file)` streams (a copy of a large file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
