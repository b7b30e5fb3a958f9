"""Is this checkpoint whole, uncorrupted and the right one? And which is the newest such?

    problems = validate(ref, job)          # [] means valid; each problem names a file or field
    found = latest_valid(job, store=store, root=root)  # newest valid, with the reason each newer one was skipped

Checks: manifest present and well-formed; every listed file present with its size and
checksum; no unlisted files; DCP `.metadata` readable and consistent with the files; the
manifest's world, layout, step and data cursor agreeing with what the ranks saved (one RNG
state per rank, the data files' ranks and, on a local copy, train_state and the loader's
state read from their few bytes); model config matching the job's; not superseded by a
rollback (supersede.py). On the store tier
the checksums are verified by downloading (restore does that anyway); `checksums=False`
checks everything else, cheaply. The DCP metadata is read without torch and without running
the pickle (dcp_outline.py), so the control side checks it too.
"""

from __future__ import annotations

import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fm_pipeline.catalog.dcp_outline import OutlineError, read_outline, read_plain_item
from fm_pipeline.catalog.manifest import Manifest, ManifestError, entry_problem, parse_manifest
from fm_pipeline.catalog.refs import (
    DCP_METADATA,
    MANIFEST,
    MARKS_DIR,
    CheckpointRef,
    is_content_file,
    list_local,
    list_store,
    local_tier,
    store_root,
)
from fm_pipeline.catalog.supersede import LEDGER, LedgerUnreadable, superseded_reason
from fm_pipeline.storage import ObjectStore, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    where: str  # a file name, or "manifest.json <field>"
    message: str
    # "missing": a listed file is absent; "superseded": see supersede.py; "invalid": a restore
    # found it corrupt (validity.py); "unreachable": the tier did not answer (no verdict).
    kind: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class CheckpointInvalid(ValueError):
    """A checkpoint that must not be used; the message lists every problem."""

    def __init__(self, ref: CheckpointRef, problems: list[Problem]):
        self.ref = ref
        self.problems = problems
        super().__init__(f"checkpoint {ref.location} is not valid:\n" +
                         "\n".join(f"  - {p}" for p in problems))


def read_manifest(ref: CheckpointRef) -> Manifest:
    """The parsed manifest; FileNotFoundError if the checkpoint was never committed."""
    try:
        data = ref.read_bytes(MANIFEST)
    except (FileNotFoundError, StoreError) as e:
        raise FileNotFoundError(f"{ref.location}: no {MANIFEST} (incomplete save): {e}") from None
    return parse_manifest(data, where=ref.location)


def validate(ref: CheckpointRef | str | Path, job=None, *, checksums: bool = True,
             dcp: bool = True) -> list[Problem]:
    """Every problem with the checkpoint; [] means it can be restored. `job`: a JobSpec.
    `dcp=False`: leave torch's own `.metadata` unread (a quick look whose restore, which
    reads it anyway, comes later)."""
    if not isinstance(ref, CheckpointRef):
        ref = CheckpointRef.local(ref)
    try:
        present = ref.files()
    except StoreError as e:
        return [Problem(ref.location, f"cannot list the checkpoint: {e}", kind="unreachable")]
    if not present:
        return [Problem(ref.location, "no such checkpoint (directory missing or empty)")]
    if MANIFEST not in present:
        return [Problem(MANIFEST, "missing: the save never committed (incomplete checkpoint)")]
    try:
        data = ref.read_bytes(MANIFEST)
        manifest = parse_manifest(data, where=ref.location)
    except ManifestError as e:
        return [Problem(f"{MANIFEST} {f}", msg) for f, msg in e.problems]
    except FileNotFoundError as e:
        return [Problem(MANIFEST, f"unreadable: {e}")]
    except StoreError as e:
        return [Problem(MANIFEST, f"unreadable: {e}", kind="unreachable")]
    try:  # a rollback abandoned it: intact, but never to be selected (supersede.py)
        if (why := superseded_reason(ref, data)) is not None:
            return [Problem("superseded", why, kind="superseded")]
    except (LedgerUnreadable, StoreError) as e:  # no verdict possible: never set aside
        return [Problem(LEDGER, str(e), kind="unreachable")]
    if f"{MARKS_DIR}/invalid.json" in present and (why := invalid_reason(ref, data)):
        return [Problem("invalid", why, kind="invalid")]

    problems: list[Problem] = []
    if manifest.step != ref.step:
        problems.append(Problem(f"{MANIFEST} step",
                                f"{manifest.step}, but the directory is {ref.name}"))
    problems += _file_problems(ref, manifest, present, checksums=checksums)
    if dcp:
        problems += _dcp_metadata_problems(ref, manifest, present)
    problems += model_problems(manifest, job)
    return problems


def invalid_reason(ref: CheckpointRef, manifest_bytes: bytes) -> str | None:
    """The problems a failed restore recorded for this very manifest (validity.py), or None."""
    import hashlib

    from fm_pipeline.catalog.marks import read_mark

    mark = read_mark(ref, "invalid") or {}
    if mark.get("manifest_sha256") != hashlib.sha256(manifest_bytes).hexdigest():
        return None
    problems = mark.get("problems") or ["no detail recorded"]
    return f"a restore found it corrupt at {mark.get('written_at', '?')}: " + "; ".join(problems)


def _file_problems(ref, manifest: Manifest, present: dict[str, int], *, checksums: bool):
    problems = []
    listed = manifest.file_map()
    content = {n: s for n, s in present.items() if is_content_file(n)}
    for name in sorted(listed.keys() - content.keys()):
        problems.append(Problem(name, f"missing (the manifest lists {listed[name].size} bytes)",
                                kind="missing"))
    for name in sorted(content.keys() - listed.keys()):
        problems.append(Problem(name, "not listed in the manifest (extra file)"))
    same_size = []
    for name in sorted(listed.keys() & content.keys()):
        if content[name] != listed[name].size:
            problems.append(Problem(
                name, f"size {content[name]} bytes, the manifest says {listed[name].size} "
                      "(truncated or overwritten)"))
        else:
            same_size.append(name)
    if manifest.total_bytes != sum(f.size for f in manifest.files):
        problems.append(Problem(f"{MANIFEST} total_bytes",
                                f"{manifest.total_bytes} is not the sum of the file sizes"))
    if checksums and same_size:
        with ThreadPoolExecutor(max_workers=2) as pool:
            found = pool.map(lambda n: _checksum_problem(ref, listed[n]), same_size)
            problems += [Problem(n, msg) for n, msg in zip(same_size, found, strict=True) if msg]
    return problems


def _checksum_problem(ref: CheckpointRef, entry) -> str | None:
    if ref.dir is not None:
        return entry_problem(ref.dir / entry.path, entry)
    with tempfile.TemporaryDirectory(prefix="fm-ckpt-verify-") as tmp:
        path = ref.store.get_file(f"{ref.prefix}/{entry.path}", Path(tmp) / "f")
        return entry_problem(path, entry)


def read_dcp_metadata(ref: CheckpointRef):
    """torch's own Metadata object for the checkpoint (downloads `.metadata` if remote)."""
    from torch.distributed.checkpoint import FileSystemReader

    if ref.dir is not None:
        return FileSystemReader(str(ref.dir)).read_metadata()
    with tempfile.TemporaryDirectory(prefix="fm-ckpt-meta-") as tmp:
        ref.store.get_file(f"{ref.prefix}/{DCP_METADATA}", Path(tmp) / DCP_METADATA)
        return FileSystemReader(tmp).read_metadata()


def _dcp_metadata_problems(ref, manifest: Manifest, present: dict[str, int]):
    if DCP_METADATA not in present:
        return []  # already reported as a missing file
    try:
        outline = read_outline(ref.read_bytes(DCP_METADATA))
    except OutlineError as e:
        return [Problem(DCP_METADATA, f"unreadable DCP metadata: {e}")]
    except (OSError, StoreError) as e:
        return [Problem(DCP_METADATA, f"unreadable: {e}")]
    problems = []
    sizes = {f.path: f.size for f in manifest.files}
    bad_refs: dict[str, str] = {}
    for path, offset, length in outline.storage:
        if path not in sizes:
            bad_refs.setdefault(path, "is referenced by .metadata but not in the manifest")
        elif offset + length > sizes[path]:
            bad_refs.setdefault(path, f"is shorter than .metadata expects "
                                      f"({offset + length} > {sizes[path]} bytes)")
    problems += [Problem(p, msg) for p, msg in sorted(bad_refs.items())]
    for part in manifest.state_keys:
        if not any(k == part or k.startswith(f"{part}.") for k in outline.state_keys):
            problems.append(Problem(DCP_METADATA, f"holds no entries for state part {part!r} "
                                                  "that the manifest lists"))
    return problems + _topology_problems(ref, manifest, outline)


# Manifest claims and the DCP entry the trainer saved beside them (train/state.py, the loader).
_SAVED_AS = (("train_state.step", "step"), ("train_state.tokens_seen", "tokens_seen"),
             ("dataloader.samples_consumed", "data.cursor.samples_consumed"),
             ("dataloader.global_batch_size", "data.cursor.global_batch_size"),
             ("dataloader.mix_key", "data.cursor.mix_key"))


def _topology_problems(ref, manifest: Manifest, outline) -> list[Problem]:
    """The manifest's world, layout, step and data cursor against what the ranks saved:
    one RNG state per rank of the saving world, the data files' ranks, and (on a local copy,
    where a few bytes are read cheaply) the trainer's own topology, step and loader state."""
    p = manifest.parallelism
    claim = f"the manifest says world_size {p.world_size}"
    problems = []
    rng = {int(k.rsplit(".rank", 1)[1]) for k in outline.state_keys
           if k.startswith("train_state.rng.rank") and k.rsplit(".rank", 1)[1].isdigit()}
    if rng and rng != set(range(p.world_size)):
        problems.append(Problem(f"{MANIFEST} parallelism.world_size", (
            f"{claim}, but the checkpoint holds the RNG states of ranks "
            f"{_ranks(rng)} (a world of {max(rng) + 1})")))
    saving = outline.saving_ranks()
    if saving and max(saving) >= p.world_size:
        problems.append(Problem(f"{MANIFEST} parallelism.world_size", (
            f"{claim}, but rank {max(saving)} wrote {DCP_METADATA}'s data files")))
    if ref.dir is None:
        return problems
    from fm_pipeline.catalog.topology import layout_key

    claims = {"topology": layout_key(p, world_size=p.world_size, dp_shard=p.dp_shard),
              "step": manifest.step, "tokens_seen": manifest.tokens_seen,
              **{f"data.cursor.{k}": v for k, v in (manifest.data.cursor or {}).items()}}
    for entry, field in (("train_state.topology", "topology"), *_SAVED_AS):
        if entry not in outline.plain_items or field not in claims:
            continue
        path, offset, length = outline.plain_items[entry]
        if not (ref.dir / path).is_file():  # another node's file: its absence is reported
            continue
        try:
            with open(ref.dir / path, "rb") as f:
                f.seek(offset)
                saved = read_plain_item(f.read(length))
        except (OSError, OutlineError) as e:
            problems.append(Problem(path, f"cannot read the saved {entry}: {e}"))
            continue
        if saved != claims[field]:
            where = "parallelism" if field == "topology" else field
            problems.append(Problem(f"{MANIFEST} {where}", (
                f"says {claims[field]!r}, but the ranks saved {entry} = {saved!r}")))
    return problems


def _ranks(ranks: set[int]) -> str:
    ordered = sorted(ranks)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def model_problems(manifest: Manifest, job) -> list[Problem]:
    from fm_pipeline.model.config import ModelConfig

    problems = []
    try:
        own_hash = ModelConfig(**manifest.model.config).config_hash()
    except (TypeError, ValueError) as e:
        return [Problem(f"{MANIFEST} model.config", f"not a valid model config: {e}")]
    if own_hash != manifest.model.hash:
        problems.append(Problem(f"{MANIFEST} model.hash",
                                f"{manifest.model.hash} does not match its model.config "
                                f"({own_hash})"))
    if job is None:
        return problems
    want = job.model_cfg.model_dump()
    for key in sorted(want.keys() | manifest.model.config.keys()):
        have = manifest.model.config.get(key)
        if have != want.get(key):
            problems.append(Problem(
                f"{MANIFEST} model.config.{key}",
                f"checkpoint has {have!r}, job {job.name!r} has {want.get(key)!r} "
                "(a checkpoint of another model)"))
    return problems


@dataclass
class Discovery:
    """Result of `latest_valid`: the newest valid checkpoint and why newer ones were skipped."""

    found: CheckpointRef | None
    manifest: Manifest | None = None
    skipped: list[tuple[CheckpointRef, list[Problem]]] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)  # tiers that could not be listed

    def skipped_lines(self) -> list[str]:
        return [f"{ref.location}: " + "; ".join(str(p) for p in probs)
                for ref, probs in self.skipped]


def candidates(job_name: str, *, store: ObjectStore | None = None,
               tiers: tuple[str, ...] = ("local", "store"), root: Path | None = None,
               unreachable: list[str] | None = None):
    """Every checkpoint of the job in the given tiers, newest first; local before store.
    A store that cannot be listed is logged (and noted in `unreachable`), not fatal: the
    local tier may still hold what is needed."""
    refs: list[CheckpointRef] = []
    if "local" in tiers:
        refs += list_local(local_tier(root))
    if "store" in tiers and store is not None:
        try:
            refs += list_store(store, store_root(job_name))
        except StoreError as e:
            log.warning("cannot list checkpoints in %s: %s", store.uri, e)
            if unreachable is not None:
                unreachable.append(f"{store.uri}: {e}")
    return sorted(refs, key=lambda r: (-r.step, not r.is_local))


def latest_valid(job, *, store: ObjectStore | None = None,
                 tiers: tuple[str, ...] = ("local", "store"), checksums: bool = True,
                 dcp: bool = True, root: Path | None = None) -> Discovery:
    """Newest checkpoint of `job` (a JobSpec, or a job name) that passes `validate`."""
    job_name = job if isinstance(job, str) else job.name
    spec = None if isinstance(job, str) else job
    discovery = Discovery(found=None)
    refs = candidates(job_name, store=store, tiers=tiers, root=root,
                      unreachable=discovery.unreachable)
    for ref in refs:
        problems = validate(ref, spec, checksums=checksums, dcp=dcp)
        if not problems:
            discovery.found = ref
            discovery.manifest = read_manifest(ref)
            break
        discovery.skipped.append((ref, problems))
        log.warning("skipping checkpoint %s: %s", ref.location, "; ".join(map(str, problems)))
    return discovery
