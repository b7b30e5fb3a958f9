"""A snapshot of the regular files under a directory, as S3's list is.

    for rel, size in walk_files(root, skip=is_sidecar): ...

What another process deletes meanwhile (retention removing a checkpoint) is left out, never
an error: rglob raised on a directory that vanished under it, and the API's status answered
500. A root that does not exist lists as empty.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path


def walk_files(root: Path, *, under: Path | None = None,
               skip: Callable[[str], bool] | None = None) -> Iterator[tuple[str, int]]:
    """(path relative to `root` in posix form, size) of each regular file below `under`
    (default: `root`), in no particular order; names `skip` accepts are left out."""
    root = Path(root)
    for folder, _, names in os.walk(under if under is not None else root):
        for name in names:
            if skip is not None and skip(name):
                continue
            p = Path(folder, name)
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield p.relative_to(root).as_posix(), st.st_size
