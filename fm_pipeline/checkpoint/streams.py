"""Single-pass checkpoint writes: every byte is checksummed as DCP writes it, and written
back to the disk while the rest of the file is still being produced.

    writer = ChecksummingWriter(directory, algorithm="crc32c")
    dcp.save(state, storage_writer=writer)
    writer.entries()      # [FileEntry(path, size, crc32c)] of the files this rank wrote

A raw write + fsync copies the bytes into the page cache and then waits for the disk. Here
each `write()` call hashes the buffer it is given (CRC32C and SHA-256 release the GIL), and
every WRITEBACK_BYTES the range just written is handed to the disk (`sync_file_range`), so
the final fsync only waits for the tail. No byte is read back to be checksummed.

Drop-behind: once a range is on the disk (DROP_BEHIND_BYTES behind the writer) its pages
leave the page cache (`posix_fadvise(DONTNEED)`), so a file of any size holds ~64 MB of
cache and the next writes reuse the pages just freed. New page-cache memory is what made
checkpoint writes slow: on a VM whose free memory is handed back to the host (virtio-balloon
free page reporting, Firecracker here) every fresh page costs a host page fault, and writing
350 MB into a new file kept in cache ran at 0.33 GB/s against 1.1-1.4 GB/s when the same
bytes overwrote one file (docs/checkpoints.md, Benchmark). It also keeps checkpoints from
evicting the training data's cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import os
import threading
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from fm_pipeline.catalog.manifest import CHECKSUMS, FileEntry

WRITEBACK_BYTES = 16 << 20
COALESCE_BYTES = 64 << 10  # smaller writes are gathered (torch.save: ~30 per tensor record)
DROP_BEHIND_BYTES = 64 << 20  # written back and dropped from the cache this far behind
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range, do not wait
_SYNC_FILE_RANGE_WAIT = 1 | 2 | 4  # wait for earlier writeback, write, wait for this one


def _load_sync_file_range():
    """Linux's sync_file_range(2) (not exposed by Python's os module), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


class Hasher:
    """Incremental CRC32C or SHA-256 with one interface."""

    def __init__(self, algorithm: str):
        if algorithm not in CHECKSUMS:
            raise ValueError(f"checksum must be one of {sorted(CHECKSUMS)}, got {algorithm!r}")
        self.algorithm = algorithm
        self._crc = 0
        self._sha = hashlib.sha256() if algorithm == "sha256" else None

    def update(self, data) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            import crc32c

            self._crc = crc32c.crc32c(data, self._crc)

    def hexdigest(self) -> str:
        return self._sha.hexdigest() if self._sha is not None else f"{self._crc:08x}"


class HashingFile(io.RawIOBase):
    """A write-only file that checksums what passes through it and is durable once closed.
    `algorithm=None` writes the same way without a checksum (the benchmark's baseline)."""

    def __init__(self, path: str | Path, *, algorithm: str | None, on_close=None,
                 writeback_bytes: int = WRITEBACK_BYTES,
                 drop_behind_bytes: int | None = DROP_BEHIND_BYTES):
        super().__init__()
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._hasher = Hasher(algorithm) if algorithm is not None else None
        self._pos = 0  # bytes given to write(), the file's size once closed
        self._small = bytearray()  # small writes not yet handed to the OS
        self._written = 0  # bytes handed to the OS
        self._submitted = 0  # bytes already handed to writeback
        self._dropped = 0  # bytes on the disk and out of the page cache
        self._writeback_bytes = writeback_bytes
        self._drop_behind = drop_behind_bytes
        self._on_close = on_close

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        """Nothing to do: small writes reach the OS when 64 KB have gathered, before the
        next large one, or at close (durability is the close's fsync anyway); torch.save
        flushes after every record."""

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        if self._hasher is not None:
            self._hasher.update(view)
        self._pos += len(view)
        if len(view) < COALESCE_BYTES:  # zip headers, pickles: gathered into one write
            self._small += view
            if len(self._small) >= COALESCE_BYTES:
                self._flush_small()
            return len(view)
        self._flush_small()
        self._write_out(view)
        return len(view)

    def _flush_small(self) -> None:
        if self._small:
            self._write_out(memoryview(self._small))
            self._small = bytearray()

    def _write_out(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        self._written += done
        if (_sync_file_range is not None
                and self._written - self._submitted >= self._writeback_bytes):
            _sync_file_range(self._fd, self._submitted, self._written - self._submitted,
                             _SYNC_FILE_RANGE_WRITE)
            self._submitted = self._written
            if self._drop_behind is not None:
                self._drop_until(self._submitted - self._drop_behind)

    def _drop_until(self, end: int) -> None:
        """Wait for [dropped, end) to reach the disk, then free its pages (a partly written
        last page stays: DONTNEED drops whole clean pages only)."""
        if end - self._dropped < self._writeback_bytes:
            return
        _sync_file_range(self._fd, self._dropped, end - self._dropped, _SYNC_FILE_RANGE_WAIT)
        os.posix_fadvise(self._fd, self._dropped, end - self._dropped, os.POSIX_FADV_DONTNEED)
        self._dropped = end

    def close(self) -> None:
        """fsync (waits only for what writeback has not finished), then report the entry."""
        if self.closed:
            return
        try:
            self._flush_small()
            os.fsync(self._fd)
            if self._drop_behind is not None and self._dropped:  # a big file: drop its tail
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(self._fd)
            super().close()
        if self._on_close is not None and self._hasher is not None:
            self._on_close(self.path, self._pos, self._hasher.hexdigest())

    def abandon(self) -> None:
        """Close without fsync or report (the write failed)."""
        if not self.closed:
            os.close(self._fd)
            super().close()


class ChecksumFileSystem(FileSystem):
    """DCP's local FileSystem, with write streams that hash and fsync (see HashingFile).
    `entries` maps final file names to (size, checksum); renames carry them along."""

    def __init__(self, algorithm: str):
        self.algorithm = algorithm
        self.entries: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()

    def _record(self, path: Path, size: int, digest: str) -> None:
        with self._lock:
            self.entries[path.name] = (size, digest)

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = HashingFile(path, algorithm=self.algorithm, on_close=self._record)
        try:
            yield stream
        except BaseException:
            stream.abandon()
            raise
        stream.close()

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        with self._lock:
            if (entry := self.entries.pop(Path(path).name, None)) is not None:
                self.entries[Path(new_path).name] = entry


class ChecksummingWriter(FileSystemWriter):
    """FileSystemWriter over ChecksumFileSystem: the files this rank wrote, with checksums,
    without reading them back. `referenced` (coordinator only) is every data file named
    by the checkpoint's `.metadata`."""

    def __init__(self, path: str | Path, *, algorithm: str = "crc32c", thread_count: int = 1):
        super().__init__(str(path), sync_files=False, thread_count=thread_count)
        self.fs = ChecksumFileSystem(algorithm)
        self.path = self.fs.init_path(str(path))
        self.referenced: set[str] | None = None

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        self.referenced = {info.relative_path for info in metadata.storage_data.values()
                           if getattr(info, "relative_path", None)}

    def entries(self) -> list[FileEntry]:
        algorithm = self.fs.algorithm
        return [FileEntry(path=name, size=size, **{algorithm: digest})
                for name, (size, digest) in sorted(self.fs.entries.items())]


def write_file(path: Path, write, *, algorithm: str = "crc32c") -> FileEntry:
    """Write a small file with `write(stream)` through a HashingFile; its manifest entry."""
    out: list = []
    stream = HashingFile(path, algorithm=algorithm,
                         on_close=lambda p, n, d: out.append((n, d)))
    try:
        write(stream)
    except BaseException:
        stream.abandon()
        raise
    stream.close()
    size, digest = out[0]
    return FileEntry(path=path.name, size=size, **{algorithm: digest})
