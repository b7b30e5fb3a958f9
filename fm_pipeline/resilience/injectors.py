"""Faults in files: checkpoint files flipped, truncated or deleted; a data shard corrupted;
a disk that fills up (a small tmpfs mounted over a directory).

    victim = checkpoint_victim(ckpt_dir)       # its largest DCP shard file
    flip_byte(victim); truncate(victim); delete(victim)
    path, what = corrupt_shard(store_dir, mix, sample=48)  # the shard step 7 reads
    with small_disk(site.checkpoints_dir(job), size_bytes=6 << 20) as disk: ...
        disk.grow(64 << 20)                    # the operator frees space

Each returns what it did, in words, for the fault matrix. small_disk needs root (mount);
elsewhere it raises Unavailable with the reason, and the caller skips.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path


class Unavailable(RuntimeError):
    """This fault cannot be injected on this machine (the message says why)."""


def checkpoint_victim(ckpt_dir: Path) -> Path:
    """The checkpoint's largest DCP shard file (model and optimizer state live there)."""
    shards = sorted(ckpt_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)
    if not shards:
        raise FileNotFoundError(f"{ckpt_dir}: no .distcp files to corrupt")
    return shards[-1]


def flip_byte(path: Path, *, offset: int | None = None) -> str:
    """Invert one byte in the middle of the file (size unchanged: only a checksum sees it)."""
    size = path.stat().st_size
    offset = size // 2 if offset is None else offset
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return f"flipped byte {offset} of {path.name} ({size} bytes)"


def truncate(path: Path, *, keep: float = 0.5) -> str:
    size = path.stat().st_size
    new = int(size * keep)
    os.truncate(path, new)
    return f"truncated {path.name} from {size} to {new} bytes"


def delete(path: Path) -> str:
    path.unlink()
    return f"deleted {path.name}"


def shard_of_sample(mix, sample: int) -> str:
    """Store key of the training shard that holds global sample `sample` of `mix`."""
    import numpy as np

    from fm_pipeline.data.sample_index import split_entries

    source_ids, windows = split_entries(mix.index_entries(sample, 1))
    source = mix.manifest.sources[int(source_ids[0])]
    shards = source.split_shards("train")
    starts = np.cumsum([s.tokens // mix.window for s in shards])
    return shards[int(np.searchsorted(starts, int(windows[0]), side="right"))].key


def corrupt_shard(store_dir: Path, mix, *, sample: int) -> tuple[Path, str]:
    """Flip a byte of the shard holding global sample `sample`, in a local-directory store:
    the first step that reads that sample meets it. Flipping the same byte again repairs it."""
    key = shard_of_sample(mix, sample)
    path = store_dir / key
    return path, flip_byte(path) + f" (shard {key}, holding global sample {sample})"


class SmallDisk:
    """A tmpfs mounted over a directory; `grow` is the operator freeing space."""

    def __init__(self, directory: Path, size_bytes: int):
        self.directory = directory
        self.size_bytes = size_bytes

    def grow(self, size_bytes: int) -> None:
        _mount(["-o", f"remount,size={size_bytes}", str(self.directory)])
        self.size_bytes = size_bytes


def _mount(args: list[str]) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        raise Unavailable(f"mount {' '.join(args)} failed: {done.stderr.strip()}")


@contextlib.contextmanager
def small_disk(directory: Path, *, size_bytes: int):
    """Mount a tmpfs of `size_bytes` over `directory` (created if needed) for the block;
    unmounted afterwards even on failure: what was written there is gone with it."""
    if os.geteuid() != 0:
        raise Unavailable("mounting a small tmpfs needs root (the disk-full fault)")
    if shutil.which("mount") is None:
        raise Unavailable("no mount command")
    directory.mkdir(parents=True, exist_ok=True)
    _mount(["-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)])
    try:
        yield SmallDisk(directory, size_bytes)
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


@contextlib.contextmanager
def read_only_dir(directory: Path):
    """Mount an empty read-only tmpfs over `directory` for the block (a checkpoint tier whose
    volume went read-only: every write fails with EROFS, even for root)."""
    if os.geteuid() != 0:
        raise Unavailable("mounting a read-only tmpfs needs root (the read-only tier fault)")
    if shutil.which("mount") is None:
        raise Unavailable("no mount command")
    directory.mkdir(parents=True, exist_ok=True)
    _mount(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(directory)])
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)
