"""Which checkpoints to keep, in either tier, and deleting the rest.

    report = apply_retention("demo", keep_last=3, milestone_every=100)            # local tier
    report = apply_retention("demo", tier="store", store=store, keep_last=3)      # store tier
    print(report.summary())

Kept: the last `keep_last` committed checkpoints, every `milestone_every`-th step, anything
marked drill-passed, evaluated or pinned (see marks.py), and always the newest checkpoint that
passes validation (even if newer ones exist but are corrupt). Checkpoints a rollback
superseded (supersede.py) are kept and counted in neither. Incomplete directories older
than the newest committed checkpoint are leftovers of crashed saves and are removed; newer
ones may be a save in flight and are left alone. Every deletion is logged with its size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from fm_pipeline.checkpoint.layout import (
    MANIFEST,
    CheckpointRef,
    delete_checkpoint,
    list_local,
    list_store,
    local_root,
    store_root,
)
from fm_pipeline.checkpoint.marks import keep_reason, read_marks
from fm_pipeline.checkpoint.supersede import LedgerUnreadable, superseded_steps
from fm_pipeline.checkpoint.validate import validate
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    tier: str
    location: str
    kept: dict[int, list[str]] = field(default_factory=dict)
    deleted: dict[int, int] = field(default_factory=dict)  # step -> bytes freed
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def bytes_freed(self) -> int:
        return sum(self.deleted.values())

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        kept = ", ".join(f"{s} ({'/'.join(r)})" for s, r in sorted(self.kept.items()))
        gone = ", ".join(str(s) for s in sorted(self.deleted)) or "nothing"
        return (f"{self.tier} {self.location}: kept {kept or 'nothing'}; {verb} {gone}, "
                f"{self.bytes_freed / 1e6:.1f} MB freed")

    def as_dict(self) -> dict:
        return {"tier": self.tier, "location": self.location, "dry_run": self.dry_run,
                "kept": {str(k): v for k, v in sorted(self.kept.items())},
                "deleted": {str(k): v for k, v in sorted(self.deleted.items())},
                "bytes_freed": self.bytes_freed, "errors": self.errors}


def _newest_valid(committed: list[CheckpointRef], *, job, checksums: bool,
                  known_valid: set[int]) -> int | None:
    for ref in sorted(committed, key=lambda r: -r.step):
        if ref.step in known_valid or not validate(ref, job, checksums=checksums):
            return ref.step
    return None


def plan_retention(refs: list[CheckpointRef], *, keep_last: int, milestone_every: int = 0,
                   job=None, checksums: bool = True,
                   known_valid: set[int] = frozenset()) -> dict[int, list[str]]:
    """step -> reasons to keep it (an empty list means delete)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    committed = [r for r in refs if r.has(MANIFEST)]
    reasons: dict[int, list[str]] = {r.step: [] for r in refs}
    try:  # abandoned by a rollback: kept aside, and never counted as last-k or newest
        superseded = superseded_steps(committed)
    except LedgerUnreadable as e:
        log.error("retention keeps everything: %s", e)
        return {r.step: ["rollback ledger unreadable"] for r in refs}
    for step in superseded:
        reasons[step].append("superseded")
    committed = [r for r in committed if r.step not in superseded]
    newest_committed = max((r.step for r in committed), default=-1)
    for r in refs:
        if r.step in superseded:
            continue
        if r not in committed:
            if r.step > newest_committed:
                reasons[r.step].append("incomplete, possibly in flight")
            continue
        if milestone_every and r.step % milestone_every == 0:
            reasons[r.step].append("milestone")
        if (why := keep_reason(read_marks(r))) is not None:
            reasons[r.step].append(why)
    for r in sorted(committed, key=lambda r: -r.step)[:keep_last]:
        reasons[r.step].append("last-k")
    newest = _newest_valid(committed, job=job, checksums=checksums, known_valid=known_valid)
    if newest is not None:
        reasons[newest].append("newest-valid")
    return reasons


def apply_retention(job_name: str, *, keep_last: int, milestone_every: int = 0,
                    tier: str = "local", store: ObjectStore | None = None, job=None,
                    root: Path | None = None, known_valid: set[int] = frozenset(),
                    dry_run: bool = False) -> RetentionReport:
    """Delete what `plan_retention` does not keep. Local checksums are verified to find the
    newest valid checkpoint; in the store, structure and sizes (the store checked content
    hashes on upload)."""
    if tier == "local":
        where = Path(root or local_root(job_name))
        refs, location, checksums = list_local(where), str(where), True
    elif tier == "store":
        if store is None:
            raise ValueError("apply_retention(tier='store') needs a store")
        refs, location, checksums = list_store(store, store_root(job_name)), \
            store.uri_of(store_root(job_name)), False
    else:
        raise ValueError(f"tier must be 'local' or 'store', got {tier!r}")
    report = RetentionReport(tier=tier, location=location, dry_run=dry_run)
    plan = plan_retention(refs, keep_last=keep_last, milestone_every=milestone_every, job=job,
                          checksums=checksums, known_valid=known_valid)
    for ref in refs:
        if plan[ref.step]:
            report.kept[ref.step] = plan[ref.step]
            continue
        if dry_run:
            report.deleted[ref.step] = sum(ref.files().values())
            continue
        try:
            freed = delete_checkpoint(ref)
        except (OSError, StoreError) as e:
            report.errors.append(f"{ref.location}: {e}")
            log.error("retention could not delete %s: %s", ref.location, e)
            continue
        report.deleted[ref.step] = freed
        log.info("retention deleted %s (%.1f MB)", ref.location, freed / 1e6)
    if report.deleted:
        log.info("retention: %s", report.summary())
    return report
