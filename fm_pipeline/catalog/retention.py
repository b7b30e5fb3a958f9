"""Which checkpoints to keep, in either tier, and deleting the rest.

    report = apply_retention("demo", keep_last=3, milestone_every=100, root=root)  # local
    report = apply_retention("demo", tier="store", store=store, keep_last=3)      # store tier
    print(report.summary())

Kept: the last `keep_last` checkpoints that validate, every `milestone_every`-th step,
anything marked drill-passed, evaluated or pinned (see marks.py), and always the newest
checkpoint that validates. A committed checkpoint that fails validation is counted in none
of these and is set aside with its problems (set_aside.py): never kept in place of a valid one,
never deleted. A tier that cannot be judged (store unreachable) keeps everything. Checkpoints
a rollback superseded (supersede.py) are kept and counted in neither. Incomplete directories older
than the newest committed checkpoint are leftovers of crashed saves and are removed; newer
ones may be a save in flight and are left alone. Every deletion is logged with its size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from fm_pipeline.catalog.set_aside import set_aside
from fm_pipeline.catalog.marks import keep_reason, read_marks
from fm_pipeline.catalog.refs import (
    MANIFEST,
    CheckpointRef,
    delete_checkpoint,
    list_local,
    list_store,
    local_tier,
    store_root,
)
from fm_pipeline.catalog.supersede import LedgerUnreadable, superseded_steps
from fm_pipeline.catalog.validity import check
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    tier: str
    location: str
    kept: dict[int, list[str]] = field(default_factory=dict)
    deleted: dict[int, int] = field(default_factory=dict)  # step -> bytes freed
    set_aside: dict[int, str] = field(default_factory=dict)  # step -> why it is invalid
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def bytes_freed(self) -> int:
        return sum(self.deleted.values())

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        kept = ", ".join(f"{s} ({'/'.join(r)})" for s, r in sorted(self.kept.items()))
        gone = ", ".join(str(s) for s in sorted(self.deleted)) or "nothing"
        moved = "would set aside" if self.dry_run else "set aside"
        aside = (f"; {moved} as invalid {', '.join(map(str, sorted(self.set_aside)))}"
                 if self.set_aside else "")
        return (f"{self.tier} {self.location}: kept {kept or 'nothing'}; {verb} {gone}, "
                f"{self.bytes_freed / 1e6:.1f} MB freed{aside}")

    def as_dict(self) -> dict:
        return {"tier": self.tier, "location": self.location, "dry_run": self.dry_run,
                "kept": {str(k): v for k, v in sorted(self.kept.items())},
                "deleted": {str(k): v for k, v in sorted(self.deleted.items())},
                "set_aside": {str(k): v for k, v in sorted(self.set_aside.items())},
                "bytes_freed": self.bytes_freed, "errors": self.errors}


def plan_retention(refs: list[CheckpointRef], *, keep_last: int, milestone_every: int = 0,
                   job=None, known_valid: set[int] = frozenset(),
                   partial_copy: bool = False) -> tuple[dict[int, list[str]], dict[int, str]]:
    """(step -> reasons to keep it, an empty list meaning delete; step -> why it is invalid,
    to be set aside). Only checkpoints that validate (verdict.check) count as last-k and
    newest-valid; `known_valid`: steps just committed by this process."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    committed = [r for r in refs if r.has(MANIFEST)]
    reasons: dict[int, list[str]] = {r.step: [] for r in refs}
    try:  # abandoned by a rollback: kept aside, and never counted as last-k or newest
        superseded = superseded_steps(committed)
    except LedgerUnreadable as e:
        log.error("retention keeps everything: %s", e)
        return {r.step: ["rollback ledger unreadable"] for r in refs}, {}
    for step in superseded:
        reasons[step].append("superseded")
    committed = [r for r in committed if r.step not in superseded]
    invalid: dict[int, str] = {}
    for r in committed:
        if r.step in known_valid:
            continue
        problems = check(r, job, partial_copy=partial_copy)
        if any(p.kind == "unreachable" for p in problems):
            log.error("retention keeps everything in %s: %s", r.location, problems[0])
            return {r.step: ["tier unreachable"] for r in refs}, {}
        if problems:
            invalid[r.step] = "; ".join(map(str, problems))
    newest_committed = max((r.step for r in committed), default=-1)
    valid = [r for r in committed if r.step not in invalid]
    for r in refs:
        if r.step in superseded or r.step in invalid:
            continue
        if r not in committed:
            if r.step > newest_committed:
                reasons[r.step].append("incomplete, possibly in flight")
            continue
        if milestone_every and r.step % milestone_every == 0:
            reasons[r.step].append("milestone")
        if (why := keep_reason(read_marks(r))) is not None:
            reasons[r.step].append(why)
    newest_first = sorted(valid, key=lambda r: -r.step)
    for r in newest_first[:keep_last]:
        reasons[r.step].append("last-k")
    if newest_first:
        reasons[newest_first[0].step].append("newest-valid")
    return reasons, invalid


def apply_retention(job_name: str, *, keep_last: int, milestone_every: int = 0,
                    tier: str = "local", store: ObjectStore | None = None, job=None,
                    root: Path | None = None, known_valid: set[int] = frozenset(),
                    dry_run: bool = False, partial_copy: bool = False) -> RetentionReport:
    """Delete what `plan_retention` does not keep; set aside what does not validate. Local
    checksums are verified (or their verified mark is current, validity.py); in the store,
    structure, sizes and recorded verdicts (the store checked content hashes on upload).
    `partial_copy`: this local tier holds only one node's files of each checkpoint."""
    if tier == "local":
        where = Path(local_tier(root))
        refs, location = list_local(where), str(where)
    elif tier == "store":
        if store is None:
            raise ValueError("apply_retention(tier='store') needs a store")
        refs, location = list_store(store, store_root(job_name)), \
            store.uri_of(store_root(job_name))
    else:
        raise ValueError(f"tier must be 'local' or 'store', got {tier!r}")
    report = RetentionReport(tier=tier, location=location, dry_run=dry_run)
    plan, invalid = plan_retention(refs, keep_last=keep_last, milestone_every=milestone_every,
                                   job=job, known_valid=known_valid, partial_copy=partial_copy)
    for ref in refs:
        if ref.step in invalid:  # never kept as a checkpoint, never deleted either
            report.set_aside[ref.step] = invalid[ref.step]
            if not dry_run:
                try:
                    set_aside(ref, kind="invalid", reason=f"retention: {invalid[ref.step]}")
                except (OSError, StoreError) as e:
                    report.errors.append(f"{ref.location}: could not set aside: {e}")
            continue
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
