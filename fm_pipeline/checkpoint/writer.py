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

Direct I/O (the default where the filesystem takes it): the bytes go from one reused,
page-aligned 16 MB buffer straight to the device (`O_DIRECT`), without passing through the
page cache at all. The kernel's copy into the cache and its page management are most of a
buffered write's CPU time (353 MB: ~0.16 s of system time buffered, ~0.06 s direct including
the copy into the aligned buffer), and that CPU is what an async save takes from training
on a host whose cores all compute (benchmarks.checkpoint, async_total_ratio). The unaligned
tail of a file is written buffered (O_DIRECT cleared with fcntl) and fsynced. Filesystems
without O_DIRECT (tmpfs, some FUSE mounts) get the buffered path.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import io
import mmap
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
DIRECT_ALIGN = 4096  # O_DIRECT: buffer address, length and file offset in whole blocks
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_bounce = threading.local()  # per writing thread: two aligned buffers and their writer


class _Bounce:
    """Two page-aligned buffers (anonymous mmap; reused, so their pages are faulted in once,
    not per file) and one thread that writes a full one while the caller fills the other:
    an O_DIRECT write waits for the device, and the copy + checksum of the next 16 MB
    overlaps that wait."""

    def __init__(self, size: int):
        from concurrent.futures import ThreadPoolExecutor

        self.size = size
        self.buffers = [mmap.mmap(-1, size), mmap.mmap(-1, size)]
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fm-ckpt-direct")


def _bounce_for(size: int) -> _Bounce:
    bounce = getattr(_bounce, "pair", None)
    if bounce is None or bounce.size != size:
        if bounce is not None:
            bounce.writer.shutdown(wait=True)
        bounce = _bounce.pair = _Bounce(size)
    return bounce


def _open_direct(path: Path) -> int | None:
    """An O_DIRECT descriptor for `path`, or None where the filesystem refuses it."""
    if not _O_DIRECT:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o644)
    except OSError:  # EINVAL: tmpfs and other filesystems without direct I/O
        return None


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
    `algorithm=None` writes the same way without a checksum (the benchmark's baseline).
    `direct`: None uses direct I/O where the filesystem has it, False never, True insists
    (OSError where it cannot); `self.direct` says which path was taken."""

    def __init__(self, path: str | Path, *, algorithm: str | None, on_close=None,
                 writeback_bytes: int = WRITEBACK_BYTES,
                 drop_behind_bytes: int | None = DROP_BEHIND_BYTES,
                 direct: bool | None = None):
        super().__init__()
        self.path = Path(path)
        fd = _open_direct(self.path) if direct is not False else None
        if fd is None and direct:
            raise OSError(f"{self.path}: the filesystem does not take O_DIRECT writes")
        if fd is not None and writeback_bytes % DIRECT_ALIGN:
            os.close(fd)
            raise ValueError(f"writeback_bytes must be a multiple of {DIRECT_ALIGN} for "
                             f"direct I/O, got {writeback_bytes}")
        self.direct = fd is not None
        self._fd = fd if fd is not None else os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._bounce = _bounce_for(writeback_bytes) if self.direct else None
        self._buf = self._bounce.buffers[0] if self.direct else None
        self._fill = 0  # bytes waiting in the aligned buffer (direct I/O)
        self._pending = None  # the write of the other buffer, in flight
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
        if self.direct:
            self._buffer_direct(view)
            return len(view)
        if len(view) < COALESCE_BYTES:  # zip headers, pickles: gathered into one write
            self._small += view
            if len(self._small) >= COALESCE_BYTES:
                self._flush_small()
            return len(view)
        self._flush_small()
        self._write_out(view)
        return len(view)

    def _buffer_direct(self, view: memoryview) -> None:
        """Copy into the aligned buffer; each time it is full, hand it to the writer thread
        (one O_DIRECT write) and go on filling the other one."""
        size, at = self._bounce.size, 0
        while at < len(view):
            n = min(size - self._fill, len(view) - at)
            self._buf[self._fill:self._fill + n] = view[at:at + n]
            self._fill += n
            at += n
            if self._fill == size:
                self._wait_pending()
                self._pending = self._bounce.writer.submit(self._write_all,
                                                           memoryview(self._buf))
                a, b = self._bounce.buffers
                self._buf = b if self._buf is a else a
                self._fill = 0

    def _wait_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # re-raises the write's OSError (ENOSPC, EIO) here

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        self._written += done

    def _close_direct(self) -> None:
        """The buffer's whole blocks direct, the last partial block buffered, then fsync."""
        self._wait_pending()
        whole = self._fill - self._fill % DIRECT_ALIGN
        view = memoryview(self._buf)
        if whole:
            self._write_all(view[:whole])
        if self._fill > whole:
            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~_O_DIRECT)
            self._write_all(view[whole:self._fill])
        self._fill = 0
        os.fsync(self._fd)
        if self._written % DIRECT_ALIGN:  # the buffered tail's pages
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

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
            if self.direct:
                self._close_direct()
            else:
                self._flush_small()
                os.fsync(self._fd)
                if self._drop_behind is not None and self._dropped:  # a big file's tail
                    os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(self._fd)
            super().close()
        if self._on_close is not None and self._hasher is not None:
            self._on_close(self.path, self._pos, self._hasher.hexdigest())

    def abandon(self) -> None:
        """Close without fsync or report (the write failed)."""
        if not self.closed:
            with contextlib.suppress(OSError):
                self._wait_pending()  # the writer thread must not write to a closed fd
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
