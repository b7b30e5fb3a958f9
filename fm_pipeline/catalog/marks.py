"""Marks: small JSON files next to a committed checkpoint, written after the fact.

    write_mark(ref, "drill", {"passed": True, ...})   # by the restore drill
    write_mark(ref, "eval", {"loss": {...}})           # by evaluation
    write_mark(ref, "pin", {"reason": "release candidate"})
    write_mark(ref, "upload", {...})                   # by the uploader
    write_mark(ref, "eval_pending", {...})             # recorded by the orchestrator: an
                                                       # evaluation is due

They live in `<checkpoint>/marks/<name>.json`, outside the manifest (the checkpoint's content
never changes after commit). Retention keeps checkpoints that passed a drill, were evaluated,
await an evaluation the orchestrator recorded, or are pinned.
"""

from __future__ import annotations

import json

from fm_pipeline.catalog.manifest import now_iso
from fm_pipeline.catalog.refs import MARKS_DIR, CheckpointRef
from fm_pipeline.storage import ObjectNotFound, StoreError

KNOWN = ("drill", "eval", "eval_pending", "pin", "upload", "verified", "invalid", "set_aside")


def write_mark(ref: CheckpointRef, name: str, payload: dict) -> None:
    if not name.isidentifier():
        raise ValueError(f"mark name {name!r} must be a plain word (e.g. drill, eval, pin)")
    body = {"mark": name, "written_at": now_iso(), **payload}
    ref.write_bytes(f"{MARKS_DIR}/{name}.json", (json.dumps(body, indent=2) + "\n").encode())


def read_mark(ref: CheckpointRef, name: str) -> dict | None:
    try:
        return json.loads(ref.read_bytes(f"{MARKS_DIR}/{name}.json"))
    except (FileNotFoundError, ObjectNotFound):
        return None
    except (ValueError, StoreError):
        return {"unreadable": True}


def read_marks(ref: CheckpointRef) -> dict[str, dict]:
    names = [n for n in ref.files() if n.startswith(f"{MARKS_DIR}/") and n.endswith(".json")]
    marks = {}
    for n in names:
        key = n[len(MARKS_DIR) + 1:-len(".json")]
        if (mark := read_mark(ref, key)) is not None:
            marks[key] = mark
    return marks


def keep_reason(marks: dict[str, dict]) -> str | None:
    """Why marks protect a checkpoint from retention, or None."""
    if (drill := marks.get("drill")) and drill.get("passed") is True:
        return "drill-passed"
    if "eval" in marks:
        return "evaluated"
    if "eval_pending" in marks:  # the orchestrator will evaluate it: not before that
        return "awaiting evaluation"
    if "pin" in marks:
        return f"pinned ({marks['pin'].get('reason', 'no reason given')})"
    return None
