"""Where checkpoints live and how to address one, in either tier.

    local tier   site.checkpoints_dir(job)/step-00000020/   (DCP files, probe.pt, manifest.json)
    store tier   <store>/checkpoints/<job>/step-00000020/   (same files, manifest uploaded last)

`marks/` inside a checkpoint holds sidecar JSON written after the commit (drill result,
evaluation, upload status, pins). It is not part of the checkpoint's content: the manifest
does not list it and validation ignores it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.storage import ObjectNotFound, ObjectStore
from fm_pipeline.storage.walk import walk_files

MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"
PROBE_FILE = "probe.pt"
MARKS_DIR = "marks"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    m = _STEP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def local_tier(root: str | Path | None) -> Path:
    """The job's local checkpoint directory, which its caller names (Site.checkpoints_dir):
    nothing here guesses it from the environment."""
    if root is None:
        raise ValueError("the local checkpoint tier needs its directory "
                         "(site.checkpoints_dir(job)); none was given")
    return Path(root)


def job_of(ref: "CheckpointRef") -> str:
    """The job a checkpoint in the store belongs to (checkpoints/<job>/step-...)."""
    return ref.prefix.split("/")[-2]


def store_root(job_name: str) -> str:
    return f"checkpoints/{job_name}"


def is_content_file(name: str) -> bool:
    """Files a manifest must list: everything but the manifest, marks and temp files."""
    return not (
        name == MANIFEST
        or name.startswith(f"{MARKS_DIR}/")
        or name.endswith(".tmp")
        or name.startswith(".manifest")
    )


@dataclass(frozen=True, eq=False)
class CheckpointRef:
    """One checkpoint in one tier: a local directory, or a key prefix in an object store."""

    step: int
    dir: Path | None = None
    store: ObjectStore | None = None
    prefix: str | None = None

    def __post_init__(self):
        if (self.dir is None) == (self.store is None):
            raise ValueError("a CheckpointRef is either local (dir) or remote (store + prefix)")

    @classmethod
    def local(cls, path: str | Path) -> "CheckpointRef":
        path = Path(path).expanduser().resolve()
        step = parse_step(path.name)
        if step is None:
            raise ValueError(f"{path}: a checkpoint directory is named step-XXXXXXXX")
        return cls(step=step, dir=path)

    @classmethod
    def remote(cls, store: ObjectStore, prefix: str) -> "CheckpointRef":
        prefix = prefix.strip("/")
        step = parse_step(prefix.rsplit("/", 1)[-1])
        if step is None:
            raise ValueError(f"{store.uri_of(prefix)}: a checkpoint prefix ends in step-XXXXXXXX")
        return cls(step=step, store=store, prefix=prefix)

    @property
    def is_local(self) -> bool:
        return self.dir is not None

    @property
    def name(self) -> str:
        return step_dir_name(self.step)

    @property
    def location(self) -> str:
        return str(self.dir) if self.dir is not None else self.store.uri_of(self.prefix)

    def __repr__(self) -> str:
        return f"CheckpointRef({self.location})"

    def files(self) -> dict[str, int]:
        """Every object in the checkpoint (relative name -> size), marks included."""
        if self.dir is not None:
            # A snapshot: a checkpoint that vanished whole (retention) lists as empty.
            return dict(sorted(walk_files(self.dir)))
        head = f"{self.prefix}/"
        return {i.key[len(head):]: i.size for i in self.store.list(head)}

    def read_bytes(self, name: str) -> bytes:
        """Raises FileNotFoundError (local) or ObjectNotFound (store) when absent."""
        if self.dir is not None:
            return (self.dir / name).read_bytes()
        return self.store.get_bytes(f"{self.prefix}/{name}")

    def has(self, name: str) -> bool:
        if self.dir is not None:
            return (self.dir / name).is_file()
        return self.store.exists(f"{self.prefix}/{name}")

    def write_bytes(self, name: str, data: bytes) -> None:
        if self.dir is not None:
            from fm_pipeline.catalog.manifest import atomic_write

            atomic_write(self.dir / name, data)
        else:
            self.store.put_bytes(data, f"{self.prefix}/{name}")


def ref_from_location(location: str, store: ObjectStore) -> CheckpointRef:
    """A checkpoint named the way a user or an API caller names one: a local step directory,
    or a location in `store` (`<store uri>/checkpoints/<job>/step-XXXXXXXX`). ValueError
    otherwise."""
    path = Path(location)
    if path.is_dir():
        return CheckpointRef.local(path)
    prefix = location.removeprefix(store.uri).strip("/")
    if prefix != location.strip("/"):
        return CheckpointRef.remote(store, prefix)
    raise ValueError(f"{location}: neither a checkpoint directory nor a location in the store "
                     f"{store.uri}")


def list_local(root: str | Path) -> list[CheckpointRef]:
    """Every step-XXXXXXXX directory under `root`, oldest first (committed or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    refs = [
        CheckpointRef(step=step, dir=p.resolve())
        for p in root.iterdir()
        if p.is_dir() and (step := parse_step(p.name)) is not None
    ]
    return sorted(refs, key=lambda r: r.step)


def newest_committed_step(root: str | Path) -> int | None:
    """The newest step in a local tier whose manifest exists (not validated: a cheap
    bound, e.g. for the fast tier's restore to know what the durable tier already has)."""
    steps = [r.step for r in list_local(root) if (r.dir / MANIFEST).is_file()]
    return max(steps, default=None)


def list_store(store: ObjectStore, root: str) -> list[CheckpointRef]:
    """Every step-XXXXXXXX prefix under `root` in the store, oldest first."""
    root = root.strip("/")
    steps: set[int] = set()
    for info in store.list(f"{root}/"):
        first = info.key[len(root) + 1:].split("/", 1)[0]
        if (step := parse_step(first)) is not None:
            steps.add(step)
    return [CheckpointRef(step=s, store=store, prefix=f"{root}/{step_dir_name(s)}")
            for s in sorted(steps)]


def delete_checkpoint(ref: CheckpointRef) -> int:
    """Remove a checkpoint, manifest first so a half-deleted one is never selectable.

    Returns the bytes freed."""
    if ref.dir is not None:
        freed = sum(ref.files().values())
        (ref.dir / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(ref.dir, ignore_errors=True)
        return freed
    freed = 0
    try:
        freed += next(
            (i.size for i in ref.store.list(f"{ref.prefix}/{MANIFEST}")
             if i.key == f"{ref.prefix}/{MANIFEST}"), 0)
        ref.store.delete(f"{ref.prefix}/{MANIFEST}")
    except ObjectNotFound:
        pass
    return freed + ref.store.delete_prefix(f"{ref.prefix}/")
