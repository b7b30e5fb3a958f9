"""Set a checkpoint aside: out of the checkpoint namespace, kept with its reason, never deleted.

    dest = set_aside(ref, kind="invalid", reason="__0_0.distcp: crc32c mismatch ...")
    for entry in list_set_aside(job_name, store=store, root=root): print(entry.kind, entry.reason)

A checkpoint is set aside when something must take its place or must never count again: a
rollback superseded it (supersede.py), it failed validation where a new save of its step or
retention met it, or the store held another checkpoint of a step being uploaded. The copy
keeps every file and gains `marks/set_aside.json` (kind, reason, where it was, when).

    local   <root>/<kind>/<utc>/step-XXXXXXXX/          (a rename: instant)
    store   checkpoints/<job>/<kind>/<utc>/step-XXXXXXXX/  (copies, then the original is
                                                          deleted manifest first)

Discovery never looks there: checkpoints are only the `step-*` entries directly under a
tier's root.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.catalog.manifest import atomic_write, now_iso
from fm_pipeline.catalog.refs import (
    MARKS_DIR,
    CheckpointRef,
    delete_checkpoint,
    parse_step,
    local_tier,
    store_root,
)
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)

KINDS = ("superseded", "invalid", "replaced")
MARK = f"{MARKS_DIR}/set_aside.json"


@dataclass(frozen=True)
class SetAside:
    """One checkpoint moved out of the way, as `fm ckpt list` shows it."""

    ref: CheckpointRef
    kind: str
    reason: str
    moved_from: str
    at: str


def stamp() -> str:
    """A UTC time usable as a directory name (`20261201T201254.123Z`)."""
    return now_iso().replace(":", "").replace("-", "").replace("+0000", "Z")


def _mark(kind: str, reason: str, moved_from: str) -> bytes:
    body = {"mark": "set_aside", "kind": kind, "reason": reason, "moved_from": moved_from,
            "at": now_iso()}
    return (json.dumps(body, indent=2) + "\n").encode()


def set_aside(ref: CheckpointRef, *, kind: str, reason: str, when: str | None = None) -> str:
    """Move `ref` out of its tier's checkpoint namespace; returns where it went. `when`: the
    directory stamp (ranks of several nodes pass the same one for their copies)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    when = when or stamp()
    if ref.dir is not None:
        dest = ref.dir.parent / kind / when / ref.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(ref.dir, dest)
        atomic_write(dest / MARK, _mark(kind, reason, str(ref.dir)))
        where = str(dest)
    else:
        job_root = ref.prefix.rsplit("/", 1)[0]
        dest_prefix = f"{job_root}/{kind}/{when}/{ref.name}"
        head = f"{ref.prefix}/"
        for info in ref.store.list(head):  # the manifest too: the copy stays a checkpoint
            ref.store.copy(info.key, f"{dest_prefix}/{info.key[len(head):]}")
        ref.store.put_bytes(_mark(kind, reason, ref.location), f"{dest_prefix}/{MARK}")
        delete_checkpoint(ref)  # manifest first: never half-selectable
        where = ref.store.uri_of(dest_prefix)
    log.warning("checkpoint %s set aside (%s: %s) -> %s", ref.location, kind, reason, where)
    return where


def in_the_way(ref: CheckpointRef, job, *, partial_copy: bool = False) -> tuple[str, str]:
    """What to do with the committed checkpoint where a new save of its step goes:
    ("superseded" | "invalid", why) to set it aside, or ("keep", why) when it is a valid
    checkpoint (or no verdict is possible) and must not be replaced. Re-hashes every file:
    a manifest that exists is not a checkpoint that validates."""
    from fm_pipeline.catalog.validate import validate

    problems = validate(ref, job, checksums=True)
    if partial_copy:  # this node's copy holds its own ranks' files only
        problems = [p for p in problems if p.kind != "missing"]
    if not problems:
        return "keep", f"{ref.location} is already a valid committed checkpoint"
    if any(p.kind == "unreachable" for p in problems):
        return "keep", f"{ref.location} cannot be judged: " + "; ".join(map(str, problems))
    if problems[0].kind == "superseded":
        return "superseded", problems[0].message
    return "invalid", "; ".join(map(str, problems))


def _read(ref: CheckpointRef, kind: str, moved_from: str) -> SetAside:
    try:
        body = json.loads(ref.read_bytes(MARK))
    except (OSError, StoreError, ValueError):
        body = {}
    return SetAside(ref=ref, kind=body.get("kind", kind),
                    reason=body.get("reason", "no reason recorded"),
                    moved_from=body.get("moved_from", moved_from), at=body.get("at", ""))


def list_set_aside(job_name: str, *, root: Path | None = None,
                   store: ObjectStore | None = None) -> list[SetAside]:
    """Every set-aside checkpoint of the job in both tiers, oldest move first per tier."""
    out: list[SetAside] = []
    root = Path(local_tier(root))
    for kind in KINDS:
        for path in sorted(root.glob(f"{kind}/*/step-*")):
            if path.is_dir() and parse_step(path.name) is not None:
                out.append(_read(CheckpointRef.local(path), kind, str(path)))
    if store is not None:
        base = store_root(job_name)
        seen: set[str] = set()
        for kind in KINDS:
            for info in store.list(f"{base}/{kind}/"):
                parts = info.key[len(base) + 1:].split("/")
                if len(parts) < 4 or parse_step(parts[2]) is None:
                    continue
                prefix = f"{base}/{'/'.join(parts[:3])}"
                if prefix not in seen:
                    seen.add(prefix)
                    out.append(_read(CheckpointRef.remote(store, prefix), kind, prefix))
    return out

