"""Single-pass checkpoint reads: DCP loads each file once, in file order, and the checksum of
every file is computed from the very bytes that were loaded.

    reader = VerifyingReader(directory, manifest, copy_key=copies.key)
    dcp.load(state, storage_reader=reader)   # raises if a file is corrupt, naming it
    reader.problems                           # [Problem(file, why)] found on this rank

torch's FileSystemReader reads entries in state-dict order and `torch.load`s each into new
memory before copying it into the live tensor; verifying the checksums then meant reading
every file a second time. Here each rank reads the entries of a file sorted by offset,
records arrive in a reused buffer (the disk prefetches the next ones meanwhile), the bytes
are hashed there, and tensors are copied straight from the buffer into their destination
(torch_records.tensor_view; torch.load only for records it does not recognise).

Who verifies what is decided once, on the coordinator, from every rank's load plan: for each
file and each local copy of the checkpoint (ranks that see the same directory), one rank that
reads the file anyway hashes it, reading the gaps between its entries if it does not read
them all; files nobody loads (the probe batch, parts not restored) are read whole by one rank
of rank 0's copy. `.metadata` is verified by every rank as it parses it.

Drop-behind: a file that only this rank reads on its copy leaves the page cache as it is
consumed (DROP_BEHIND_BYTES behind the reader), so the readahead keeps reusing the pages just
freed instead of taking new memory: on a VM that hands free memory back to the host every
new page costs a host page fault (reading fresh 350 MB files: 0.53 s kept in cache, 0.31 s
dropped behind; docs/checkpoints.md). Files several ranks of a copy read stay cached for
the others.

Verification happens while the bytes are copied into live tensors: on a mismatch the rank
raises at the end of its reads, so DCP fails the whole load on every rank before any
Stateful part's load_state_dict runs. The tensors may be partly overwritten by then, so the
caller must not train on; restore() raises CheckpointInvalid naming the files.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import os
import pickle
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from fm_pipeline.catalog.manifest import CHECKSUMS, FileEntry, Manifest
from fm_pipeline.catalog.refs import DCP_METADATA
from fm_pipeline.catalog.validate import Problem
from fm_pipeline.checkpoint.comm import single_threaded
from fm_pipeline.checkpoint.writer import Hasher
from fm_pipeline.checkpoint.torch_records import locate, tensor_view

READ_THREADS = 2  # files read in parallel per rank (reads, hashing and copies release the GIL)
PREFETCH_BYTES = 64 << 20  # how far ahead of the reader the disk is asked to read
DROP_BEHIND_BYTES = 32 << 20  # files read by one rank: pages further behind are dropped
_CHUNK = 4 << 20
DIRECT_MIN_BYTES = 64 << 10  # smaller entries: one copy from the buffer is cheaper
_PEEK = 4096
_ADVICE_STEP = 2 << 20
_SOLE = "__read_alone__"  # key of a load plan's storage_data: files only this rank reads


class CorruptCheckpoint(ValueError):
    """Raised inside DCP's read step; restore() reports `VerifyingReader.problems`."""


def _mismatch(entry: FileEntry, size: int, digest: str | None) -> str | None:
    if size != entry.size:
        return (f"size {size} bytes, the manifest says {entry.size} (truncated or "
                "overwritten)")
    if digest is not None and digest != entry.checksum:
        return (f"{CHECKSUMS[entry.algorithm]} mismatch: file has {digest[:12]}, the manifest "
                f"says {entry.checksum[:12]} (corrupted)")
    return None


class VerifyingReader(FileSystemReader):
    def __init__(self, path: str | Path, manifest: Manifest | None, *, copy_key: str = "",
                 threads: int = READ_THREADS):
        super().__init__(str(path))
        self.manifest = manifest
        self.entries = manifest.file_map() if manifest is not None else {}
        self.copy_key = copy_key
        self.threads = threads
        self.problems: list[Problem] = []
        self.hash_s = 0.0  # seconds spent hashing, summed over threads (overlapped)
        self.verified: list[str] = []
        self._lock = threading.Lock()

    def _problem(self, where: str, message: str) -> None:
        with self._lock:
            self.problems.append(Problem(where, message))

    # -- metadata: every rank reads it whole, so every rank verifies it ----------------------

    def read_metadata(self, *args, **kwargs):
        if kwargs.get("rank") is not None:
            raise FileNotFoundError("per-rank DCP metadata is not used by fm_pipeline")
        path = Path(self._get_metadata_path())
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._problem(DCP_METADATA, "missing")
            raise
        if (entry := self.entries.get(DCP_METADATA)) is not None:
            hasher = Hasher(entry.algorithm)
            hasher.update(data)
            if why := _mismatch(entry, len(data), hasher.hexdigest()):
                self._problem(DCP_METADATA, why)
                raise CorruptCheckpoint(f"{DCP_METADATA}: {why}")
            with self._lock:
                self.verified.append(DCP_METADATA)
        try:
            metadata = pickle.loads(data)
        except Exception as e:  # noqa: BLE001 - pickle raises anything on garbage
            self._problem(DCP_METADATA, f"unreadable DCP metadata: {type(e).__name__}: {e}")
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    # -- planning: who hashes which file -------------------------------------------------------

    def prepare_local_plan(self, plan):
        return dataclasses.replace(plan, storage_data=self.copy_key)

    def prepare_global_plan(self, plans):
        """Coordinator: give each rank the files it verifies ({name: True}) and the files no
        other rank of its copy reads (`_SOLE`: their pages can be dropped behind it)."""
        keys = [p.storage_data for p in plans]
        covered = [defaultdict(int) for _ in plans]  # rank -> file -> bytes it loads
        for rank, plan in enumerate(plans):
            seen = set()
            for item in plan.items:
                if item.storage_index in seen:
                    continue
                seen.add(item.storage_index)
                info = self.storage_data[item.storage_index]
                covered[rank][info.relative_path] += info.length
        sole = []
        for rank, key in enumerate(keys):
            others = [covered[r] for r, k in enumerate(keys) if k == key and r != rank]
            sole.append([name for name in covered[rank]
                         if not any(c.get(name) for c in others)])
        if not self.entries:
            return [dataclasses.replace(p, storage_data={_SOLE: s}) for p, s in zip(plans, sole)]
        extra = [0] * len(plans)  # bytes a rank reads only to verify
        assigned: list[dict[str, bool]] = [{} for _ in plans]
        for key in dict.fromkeys(keys):
            ranks = [r for r, k in enumerate(keys) if k == key]
            for name, entry in self.entries.items():
                if name == DCP_METADATA:
                    continue
                readers = [r for r in ranks if covered[r].get(name)]
                if not readers:
                    if keys[0] != key:
                        continue  # unused on this copy; rank 0's copy verifies it
                    readers = ranks
                rank = min(readers, key=lambda r: (entry.size - covered[r].get(name, 0),
                                                   extra[r], r))
                extra[rank] += entry.size - covered[rank].get(name, 0)
                assigned[rank][name] = True
        return [dataclasses.replace(p, storage_data={**a, _SOLE: s})
                for p, a, s in zip(plans, assigned, sole)]

    # -- reading -----------------------------------------------------------------------------

    def read_data(self, plan, planner) -> Future:
        verify = dict(plan.storage_data or {})
        sole = set(verify.pop(_SOLE, ()))
        per_file: dict[str, dict] = defaultdict(dict)  # file -> storage index -> [reqs]
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            per_file[info.relative_path].setdefault(req.storage_index, []).append(req)
        names = sorted(set(per_file) | set(verify))
        planner_lock = threading.Lock()

        def one(name: str) -> None:
            groups = sorted(per_file.get(name, {}).items(),
                            key=lambda kv: self.storage_data[kv[0]].offset)
            _FileReader(self, name, groups, planner, planner_lock,
                        verify=bool(verify.get(name)), drop_behind=name in sole).run()

        workers = max(1, min(self.threads, len(names)))
        if workers == 1:
            for name in names:
                one(name)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="fm-ckpt-read",
                                    initializer=single_threaded) as pool:
                for f in [pool.submit(one, n) for n in names]:
                    f.result()
        if self.problems:
            raise CorruptCheckpoint("; ".join(map(str, self.problems)))
        fut: Future = Future()
        fut.set_result(None)
        return fut


class _FileReader:
    """One file, front to back: entries into their tensors, every byte into the hash."""

    def __init__(self, owner: VerifyingReader, name: str, groups: list, planner, planner_lock,
                 *, verify: bool, drop_behind: bool = False):
        self.owner, self.name, self.groups = owner, name, groups
        self.drop_behind = drop_behind
        self.dropped = 0  # pages before this offset have left the page cache
        self.planner, self.planner_lock = planner, planner_lock
        self.entry = owner.entries.get(name)
        self.hasher = Hasher(self.entry.algorithm) if verify and self.entry else None
        self.pos = 0
        self.prefetcher: _Prefetcher | None = None
        self.buf = bytearray()

    def run(self) -> None:
        if self.owner.entries and self.entry is None:
            self.owner._problem(self.name, "referenced by .metadata but not listed in the "
                                           "manifest")
            return
        path = Path(self.owner.path) / self.name
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self.owner._problem(self.name, "missing" + (
                f" (the manifest lists {self.entry.size} bytes)" if self.entry else ""))
            return
        try:
            self.fd, self.size = fd, os.fstat(fd).st_size
            if self.entry is not None and self.size != self.entry.size:
                self.owner._problem(self.name, _mismatch(self.entry, self.size, None))
                return  # nothing from a file of the wrong size is used
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            if PREFETCH_BYTES:
                self.prefetcher = _Prefetcher(fd, self.size)
            failure = None
            for index, reqs in self.groups:
                try:
                    self._entry(self.owner.storage_data[index], reqs)
                except Exception as e:  # noqa: BLE001 - a corrupt entry can raise anything
                    failure = f"cannot load {index.fqn}: {type(e).__name__}: {e}"
                    break
            if self.hasher is not None:
                self._skip_to(self.size)  # what this rank does not load is hashed too
                if why := _mismatch(self.entry, self.pos, self.hasher.hexdigest()):
                    failure = why  # the cause, rather than its symptom
                else:
                    with self.owner._lock:
                        self.owner.verified.append(self.name)
            if failure is not None:
                self.owner._problem(self.name, failure)
        finally:
            if self.prefetcher is not None:
                self.prefetcher.stop()
            if self.drop_behind:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

    def _entry(self, info, reqs) -> None:
        self._skip_to(info.offset)
        direct = self._direct_target(info, reqs)
        if direct is None:
            self._load(self._read(info.length), info, reqs)
            return
        rec, target = direct
        self._read(rec.data_start)
        self._read(rec.data_size, into=_bytes_of(target))
        self._read(info.length - rec.data_start - rec.data_size)
        self.planner.commit_tensor(reqs[0], target)

    def _direct_target(self, info, reqs):
        """(record layout, destination) when the saved tensor is exactly the destination's
        bytes: then the disk reads straight into the live tensor, with no copy at all."""
        req = reqs[0]
        if (len(reqs) != 1 or req.type == LoadItemType.BYTE_IO or info.transform_descriptors
                or info.length < DIRECT_MIN_BYTES):
            return None
        target = self.planner.resolve_tensor(req).detach()
        if not target.is_contiguous() or any(req.storage_offsets):
            return None
        n = min(info.length, _PEEK)
        head = os.pread(self.fd, n, info.offset)  # peeks: a few KB read again from the cache
        tail = os.pread(self.fd, n, info.offset + info.length - n)
        rec = locate(head, tail, info.length)
        if (rec is None or not rec.is_dense or rec.dtype != target.dtype
                or rec.size != tuple(target.size()) or rec.size != tuple(req.lengths)):
            return None
        return rec, target

    def _prefetch(self, need_until: int) -> None:
        if self.prefetcher is not None:
            self.prefetcher.want(need_until + PREFETCH_BYTES)

    def _skip_to(self, offset: int) -> None:
        if offset < self.pos:
            raise ValueError(f"{self.name}: entries overlap at byte {offset}")
        if self.hasher is None:
            self.pos = offset
            return
        while self.pos < offset:  # the gap is part of the file's checksum
            self._read(min(_CHUNK, offset - self.pos))

    def _read(self, n: int, into: memoryview | None = None) -> memoryview:
        """The next `n` bytes of the file (into `into`, or a reused buffer), hashed."""
        if into is None:
            if len(self.buf) < n:
                self.buf = bytearray(n)
            into = memoryview(self.buf)[:n]
        got = 0
        while got < n:  # in chunks, so each is hashed while still in the CPU cache
            self._prefetch(self.pos + n)
            chunk = into[got:got + _CHUNK]
            k = os.preadv(self.fd, [chunk], self.pos)
            if k == 0:
                raise EOFError(f"{self.name}: {n} bytes wanted at {self.pos - got}, the file "
                               "ends")
            if self.hasher is not None:
                t0 = time.perf_counter()
                self.hasher.update(chunk[:k])
                with self.owner._lock:
                    self.owner.hash_s += time.perf_counter() - t0
            got += k
            self.pos += k
            if self.drop_behind and self.pos - self.dropped >= DROP_BEHIND_BYTES + _CHUNK * 4:
                end = self.pos - DROP_BEHIND_BYTES
                os.posix_fadvise(self.fd, self.dropped, end - self.dropped,
                                 os.POSIX_FADV_DONTNEED)
                self.dropped = end
        return into

    def _load(self, view: memoryview, info, reqs) -> None:
        descriptors = info.transform_descriptors or ()
        for req in reqs:
            if req.type == LoadItemType.BYTE_IO or descriptors:
                stream = self.owner.transforms.transform_load_stream(
                    req, descriptors, io.BytesIO(bytes(view)))
                if req.type == LoadItemType.BYTE_IO:
                    with self.planner_lock:
                        self.planner.load_bytes(req, io.BytesIO(stream.read(-1)))
                    continue
                tensor = torch.load(io.BytesIO(stream.read(-1)), map_location="cpu",
                                    weights_only=True)
            else:
                tensor = tensor_view(view)
                if tensor is None:  # a record this parser does not know: torch's reader
                    tensor = torch.load(io.BytesIO(bytes(view)), map_location="cpu",
                                        weights_only=True)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = self.planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise ValueError(f"{req.storage_index.fqn}: checkpoint holds "
                                 f"{list(tensor.size())}, the model wants {list(target.size())}")
            target.copy_(tensor)
            self.planner.commit_tensor(req, target)


class _Prefetcher:
    """A thread that asks the disk for the next bytes of a file (page-cache readahead) while
    the reader copies and hashes the current ones: allocating the page cache and submitting
    the reads then overlaps the copies instead of preceding each of them."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.ahead = 0
        self.target = 0
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="fm-ckpt-prefetch", daemon=True)
        self.thread.start()

    def want(self, until: int) -> None:
        until = min(until, self.size)
        if until - self.target >= _ADVICE_STEP or (until == self.size > self.target):
            with self.cond:
                self.target = until
                self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.thread.join()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and self.ahead >= self.target:
                    self.cond.wait()
                if self.stopped:
                    return
                start, end = self.ahead, self.target
            for at in range(start, end, _ADVICE_STEP):  # Linux caps one advice at readahead size
                os.posix_fadvise(self.fd, at, min(_ADVICE_STEP, end - at),
                                 os.POSIX_FADV_WILLNEED)
                self.ahead = min(end, at + _ADVICE_STEP)
                if self.stopped:
                    return


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory."""
    n = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_ubyte * n).from_address(tensor.data_ptr())).cast("B")
