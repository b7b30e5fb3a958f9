"""A job's committed checkpoints as the orchestrator records them: each step with its
copies in the local tier and the object store, and the facts a user wants beside it.

    steps = committed_steps("demo", store, root=site.checkpoints_dir("demo"))  # {20: [...]}
    copy = preferred_copy(steps[20], tier="store")       # the durable copy when there is one
    describe(copy)                                       # step, tokens, bytes, topology, ...

"Committed" means the manifest exists (it is written last), no rollback superseded it
(supersede.py) and no restore found it corrupt (validity.py); whether the files still match
it is the validation check's job.
"""

from __future__ import annotations

from pathlib import Path

from fm_pipeline.catalog import CheckpointRef, read_manifest
from fm_pipeline.catalog.refs import MANIFEST
from fm_pipeline.catalog.supersede import superseded_steps
from fm_pipeline.catalog.validate import candidates, invalid_reason
from fm_pipeline.checkpoint.drill import describe_topology
from fm_pipeline.storage import ObjectStore, StoreError


def committed_steps(job_name: str, store: ObjectStore | None, *,
                    root: Path) -> dict[int, list[CheckpointRef]]:
    """step -> committed copies, local tier (`root`) first; oldest step first."""
    steps: dict[int, list[CheckpointRef]] = {}
    try:
        refs = candidates(job_name, store=store, root=root)
    except StoreError:  # the local tier still answers while the store is down
        refs = candidates(job_name, store=None, root=root)
    for tier in (True, False):
        committed = [r for r in refs if r.is_local == tier and r.has(MANIFEST)]
        superseded = superseded_steps(committed)  # a rollback abandoned them
        for ref in committed:
            if ref.step not in superseded and not _found_corrupt(ref):
                steps.setdefault(ref.step, []).append(ref)
    return dict(sorted(steps.items()))


def _found_corrupt(ref: CheckpointRef) -> bool:
    try:
        return invalid_reason(ref, ref.read_bytes(MANIFEST)) is not None
    except (FileNotFoundError, StoreError):
        return False


def preferred_copy(copies: list[CheckpointRef], *, tier: str = "local") -> CheckpointRef:
    """The copy in `tier` ("local" or "store") if there is one, else the other."""
    if not copies:
        raise ValueError("no committed copy of the checkpoint")
    want_local = tier == "local"
    return next((r for r in copies if r.is_local == want_local), copies[0])


def describe(ref: CheckpointRef) -> dict:
    """Plain facts about a committed checkpoint, from its manifest."""
    m = read_manifest(ref)
    p = m.parallelism
    return {
        "step": m.step, "tokens_seen": m.tokens_seen, "bytes": m.total_bytes,
        "files": len(m.files), "created_at": m.created_at, "world_size": p.world_size,
        "topology": describe_topology(p.model_dump()), "mix": m.data.mix,
        "probe_loss": m.probe.loss if m.probe else None,
        "save_blocked_s": m.timings.blocked_s, "save_commit_s": m.timings.commit_s,
        "git_sha": m.code.git_sha, "location": ref.location,
        "tier": "local" if ref.is_local else "store",
    }


def await_evaluation(copies: list[CheckpointRef], *, step: int) -> None:
    """Mark each copy as awaiting its evaluation (marks.py): retention keeps it until the
    evaluation's own mark protects it, so a checkpoint is not deleted before it is evaluated
    however the runs are ordered. Best effort per copy (a store outage is logged)."""
    import logging

    from fm_pipeline.catalog.marks import write_mark

    for ref in copies:
        try:
            write_mark(ref, "eval_pending", {"step": step})
        except (OSError, StoreError) as e:
            logging.getLogger(__name__).warning("could not mark %s: %s", ref.location, e)
