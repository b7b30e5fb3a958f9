"""Rollback: resuming a job from an older checkpoint supersedes the job's newer ones.

    supersede_newer(job_name, chosen, manifest_bytes, store=store, root=root)   # rank 0
    superseded_reason(ref, manifest_bytes)  # "the job was resumed from step 10 at ..." or None

Each tier keeps one ledger beside its checkpoints (local: `<root>/superseded.json`; store:
`checkpoints/<job>/superseded.json`), keyed by the SHA-256 of each superseded checkpoint's
manifest bytes. Writing the ledger (one atomic file or object per tier) is the rollback's
commit point; nothing is moved or deleted then. `validate` reports a ledgered checkpoint as a
problem ("superseded: ..."), so every discovery path skips it. A new save of the same step
has another manifest (another hash) and is selectable at once; a superseded checkpoint in its
way is set aside in each tier first (set_aside.py: `<root>/superseded/<utc>/`, kept).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from fm_pipeline.catalog.manifest import atomic_write, now_iso
from fm_pipeline.catalog.refs import (
    MANIFEST,
    CheckpointRef,
    list_local,
    list_store,
    store_root,
)
from fm_pipeline.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

LEDGER = "superseded.json"
FORMAT = "fm-superseded/1"


class LedgerUnreadable(ValueError):
    """A ledger that exists but cannot be parsed: no checkpoint of its tier is trusted."""


def manifest_digest(manifest_bytes: bytes) -> str:
    return hashlib.sha256(manifest_bytes).hexdigest()


def _ledger_key(ref: CheckpointRef) -> tuple[Path | None, str | None]:
    """Where the ledger of `ref`'s tier lives: (local path, None) or (None, store key)."""
    if ref.dir is not None:
        return ref.dir.parent / LEDGER, None
    return None, f"{ref.prefix.rsplit('/', 1)[0]}/{LEDGER}"


def read_ledger(ref: CheckpointRef) -> dict[str, dict]:
    """manifest digest -> entry, for the tier holding `ref`; {} when there is no ledger.
    Raises LedgerUnreadable for a damaged one, StoreError when the store does not answer."""
    path, key = _ledger_key(ref)
    try:
        data = path.read_bytes() if path is not None else ref.store.get_bytes(key)
    except (FileNotFoundError, ObjectNotFound):
        return {}
    try:
        body = json.loads(data)
        entries = body["checkpoints"]
        if body.get("format") != FORMAT or not isinstance(entries, dict):
            raise ValueError(f"format {body.get('format')!r}, expected {FORMAT!r}")
        return entries
    except (ValueError, KeyError, TypeError) as e:
        where = path if path is not None else ref.store.uri_of(key)
        raise LedgerUnreadable(f"{where}: unreadable rollback ledger ({e}); fix or remove "
                               "it to select this tier's checkpoints again") from None


def _write_ledger(ref: CheckpointRef, entries: dict[str, dict]) -> None:
    data = (json.dumps({"format": FORMAT, "checkpoints": entries}, indent=2) + "\n").encode()
    path, key = _ledger_key(ref)
    if path is not None:
        atomic_write(path, data)
    else:
        ref.store.put_bytes(data, key)  # one PUT: the object is whole or absent


def reason(entry: dict) -> str:
    return f"the job was resumed from step {entry['resumed_from']} at {entry['at']}"


def superseded_reason(ref: CheckpointRef, manifest_bytes: bytes,
                      ledger: dict[str, dict] | None = None) -> str | None:
    """Why `ref` (whose manifest is `manifest_bytes`) must not be selected, or None."""
    entries = read_ledger(ref) if ledger is None else ledger
    if not entries:
        return None
    entry = entries.get(manifest_digest(manifest_bytes))
    return reason(entry) if entry is not None else None


def superseded_steps(refs: list[CheckpointRef]) -> dict[int, str]:
    """step -> reason for the committed refs (all of one tier) that are superseded."""
    if not refs:
        return {}
    ledger = read_ledger(refs[0])
    out = {}
    for ref in refs if ledger else []:
        try:
            data = ref.read_bytes(MANIFEST)
        except (FileNotFoundError, ObjectNotFound):
            continue
        if (why := superseded_reason(ref, data, ledger)) is not None:
            out[ref.step] = why
    return out


def supersede_newer(job_name: str, chosen: CheckpointRef, chosen_manifest: bytes, *,
                    root: Path, store: ObjectStore | None) -> list[str]:
    """Ledger every committed checkpoint of the job newer than `chosen`, in both tiers (store
    first), and un-ledger `chosen` itself. Returns the locations superseded. Raises
    StoreError (or OSError) when a tier cannot be listed or written: the caller must not train
    on, or the abandoned checkpoints would stay selectable."""
    at = now_iso()
    chosen_digest = manifest_digest(chosen_manifest)
    superseded: list[str] = []
    tiers = []
    if store is not None:
        tiers.append(list_store(store, store_root(job_name)))
    tiers.append(list_local(root))
    for refs in tiers:
        if not refs:
            continue
        entries = dict(read_ledger(refs[0]))
        changed = entries.pop(chosen_digest, None) is not None
        for ref in refs:
            if ref.step <= chosen.step:
                continue
            try:
                data = ref.read_bytes(MANIFEST)
            except (FileNotFoundError, ObjectNotFound):
                continue  # never committed: not selectable anyway
            digest = manifest_digest(data)
            if digest in entries:
                continue
            entries[digest] = {"step": ref.step, "resumed_from": chosen.step,
                               "resumed_from_location": chosen.location, "at": at,
                               "location": ref.location}
            superseded.append(ref.location)
            changed = True
        if changed:
            _write_ledger(refs[0], entries)
    for where in superseded:
        log.warning("checkpoint %s superseded: the job was resumed from step %d (%s)", where,
                    chosen.step, chosen.location)
    return superseded
