"""What is known about a checkpoint's validity, kept next to it so it is not paid for twice.

    problems = check(ref, job)           # validate, re-hashing local files only when needed
    record_verified(ref)                 # rank 0 after a commit: the files were hashed as written
    record_invalid(ref, problems)        # a restore found it corrupt: every later look skips it

`marks/verified.json` holds the manifest's SHA-256 and each content file's size and mtime
when its checksums last passed; while they are unchanged, `check` verifies structure, sizes
and DCP metadata but does not re-read the bytes (retention and `fm ckpt list` run often; a
full re-hash of every kept checkpoint after each save would read the whole tier).
`marks/invalid.json` records a failed restore's problems for that manifest; `validate`
reports it (validate.py), and a copy made whole again from the store drops it (tiering.py).
"""

from __future__ import annotations

import hashlib
import logging

from fm_pipeline.catalog.marks import read_mark, write_mark
from fm_pipeline.catalog.refs import MANIFEST, CheckpointRef, is_content_file
from fm_pipeline.catalog.validate import Problem, validate
from fm_pipeline.storage import StoreError

log = logging.getLogger(__name__)

VERIFIED = "verified"
INVALID = "invalid"


def _stats(ref: CheckpointRef) -> dict[str, list[int]]:
    out = {}
    for p in sorted(ref.dir.iterdir()):
        if p.is_file() and is_content_file(p.name):
            st = p.stat()
            out[p.name] = [st.st_size, st.st_mtime_ns]
    return out


def _digest(ref: CheckpointRef) -> str | None:
    try:
        return hashlib.sha256(ref.read_bytes(MANIFEST)).hexdigest()
    except (OSError, StoreError):
        return None


def record_verified(ref: CheckpointRef, *, how: str = "re-hashed") -> None:
    """Local checkpoints only: their checksums hold for the files as they are now. `how`:
    "written" (hashed as the bytes streamed to disk, at commit) or "re-hashed"."""
    if ref.dir is None or (digest := _digest(ref)) is None:
        return
    write_mark(ref, VERIFIED, {"manifest_sha256": digest, "how": how, "files": _stats(ref)})


def _verified_is_current(ref: CheckpointRef) -> bool:
    mark = read_mark(ref, VERIFIED)
    return bool(mark) and mark.get("manifest_sha256") == _digest(ref) \
        and mark.get("files") == _stats(ref)


def record_invalid(ref: CheckpointRef, problems: list[Problem]) -> None:
    """Best effort: a tier that cannot take the mark is re-checked next time instead."""
    digest = _digest(ref)
    if digest is None:
        return
    try:
        write_mark(ref, INVALID, {"manifest_sha256": digest,
                                  "problems": [str(p) for p in problems][:20]})
    except (OSError, StoreError) as e:
        log.warning("could not record %s as invalid: %s", ref.location, e)


def check(ref: CheckpointRef, job=None, *, partial_copy: bool = False) -> list[Problem]:
    """Every problem of `ref`. Local: checksums re-hashed unless the verified mark is current
    (then kept current). Store: structure and sizes (content was verified on upload), and any
    invalid mark. `partial_copy`: this local copy holds only its node's files, so files
    listed by the manifest but absent here are not problems."""
    if ref.dir is not None and not _verified_is_current(ref):
        problems = validate(ref, job, checksums=True)
        if partial_copy:
            problems = [p for p in problems if p.kind != "missing"]
        if not problems:
            try:
                record_verified(ref)
            except OSError as e:  # a read-only tier can still be listed
                log.debug("could not record %s as verified: %s", ref.location, e)
        return problems
    problems = validate(ref, job, checksums=False)
    if partial_copy:
        problems = [p for p in problems if p.kind != "missing"]
    return problems
