"""A published data mix, opened for reading: global samples, held-out windows, the tokenizer.

    from fm_pipeline.data import open_mix, mix_key
    mix = open_mix(store, mix_key(job))
    batch = mix.samples(start=0, count=8)          # int64 [8, seq_len + 1], global samples 0..7
    for b in mix.heldout_batches("prose", batch_size=4, n_batches=2): ...

Shards are checked against their manifest SHA-256 the first time this process touches
them (`mix.verify()` checks all at once); a mismatch raises CorruptShardError naming the
shard. Shards in S3 are downloaded once into a local cache (`cache_dir`: site.data_cache(key)).

On a remote store a shard's first touch would stall the step that needs it for a whole
download; `mix.prefetch_samples(start, count)` starts, in the background, the downloads of
the shards those samples read (the loader asks for the steps ahead of the one it builds),
so the step finds them local. Each shard is fetched once: a reader that needs a shard
being fetched waits for that fetch, and only for it (one lock per shard, not one for the
mix); a failed speculative fetch is retried by the reader that needs the shard, which
raises its error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from fm_pipeline.data.errors import CorruptShardError, DataError
from fm_pipeline.data.manifest import MixManifest, ShardEntry, Split, manifest_key
from fm_pipeline.data.sample_index import pass_positions, split_entries
from fm_pipeline.storage import ObjectNotFound, ObjectStore, sha256_file

log = logging.getLogger(__name__)
PREFETCH_WORKERS = 4  # concurrent speculative downloads per process (parallel GETs)
INDEX_CACHE = 4  # index shards a reader keeps


def open_mix(store: ObjectStore, key: str, *, cache_dir: str | Path | None = None) -> "Mix":
    """The published mix `key`; DataError if it was never published (no manifest.json)."""
    try:
        raw = store.get_bytes(manifest_key(key))
    except ObjectNotFound:
        raise DataError(
            f"data mix {key} is not published in {store.uri} (no {manifest_key(key)}); "
            "prepare it with `fm data prepare --job JOB.yaml`"
        ) from None
    try:
        manifest = MixManifest.model_validate(json.loads(raw))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as e:
        raise DataError(f"unreadable manifest {store.uri_of(manifest_key(key))}: {e}") from None
    return Mix(store, manifest, cache_dir=cache_dir)


class _Stream:
    """One source's split as a sequence of windows spread over shards."""

    def __init__(self, shards: list[ShardEntry], window: int):
        self.shards = shards
        self.window = window
        per_shard = [s.tokens // window for s in shards]
        self.starts = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)

    @property
    def windows(self) -> int:
        return int(self.starts[-1])


class Mix:
    def __init__(self, store: ObjectStore, manifest: MixManifest, *, cache_dir=None):
        self.store = store
        self.manifest = manifest
        self.key = manifest.key
        self.seq_len = manifest.seq_len
        self.window = manifest.window
        self.vocab_size = manifest.vocab_size
        self.eos_id = manifest.tokenizer.eos_id
        self.source_names = [s.name for s in manifest.sources]
        self._cache_dir = Path(cache_dir) if cache_dir else None  # site.data_cache(key)
        self._streams = {
            (s.name, split): _Stream(s.split_shards(split), self.window)
            for s in manifest.sources for split in ("train", "heldout")
        }
        self._arrays: dict[str, np.ndarray] = {}
        self._pending: dict[str, Future] = {}  # shard key -> the one fetch in flight
        self._speculative: set[str] = set()  # of those, the ones prefetch_samples queued
        self._lock = threading.Lock()  # guards _arrays/_pending, never held over I/O
        index = manifest.sample_index.parts()
        self._index_parts = index
        self._index_starts = np.cumsum([0] + [p.samples for p in index]).astype(np.int64)
        self._index_cache: dict[int, np.ndarray] = {}  # the last few index shards read
        self._tokenizer = None
        self._executor: ThreadPoolExecutor | None = None
        self.remote = store.local_path(index[0].key) is None
        # started: speculative downloads; waited: a reader found its shard still being
        # fetched; on_demand: a remote shard the reader itself had to download (a stall
        # the prefetch did not prevent).
        self.prefetch_stats = {"started": 0, "waited": 0, "on_demand": 0}

    def __repr__(self) -> str:
        return f"Mix({self.key}, {len(self)} samples/pass, sources={self.source_names})"

    def __len__(self) -> int:
        """Samples in one pass of the global index (the sequence continues past it)."""
        return self.manifest.sample_index.samples

    # --- global samples (training) ---------------------------------------------------

    def samples(self, start: int, count: int) -> np.ndarray:
        """Global samples `start .. start+count` as int64 [count, seq_len + 1]."""
        entries = self.index_entries(start, count)
        source_ids, windows = split_entries(entries)
        out = np.empty((count, self.window), dtype=np.int64)
        for sid in np.unique(source_ids):
            rows = source_ids == sid
            out[rows] = self._gather(self.source_names[int(sid)], "train", windows[rows])
        return out

    def index_entries(self, start: int, count: int) -> np.ndarray:
        if start < 0 or count < 0:
            raise ValueError(f"sample range must be non-negative, got start={start} count={count}")
        positions = pass_positions(np.arange(start, start + count, dtype=np.int64), len(self),
                                   seed=self.manifest.seed)
        shard_ids = np.searchsorted(self._index_starts, positions, side="right") - 1
        out = np.empty(len(positions), dtype=np.int64)
        for j in np.unique(shard_ids):
            rows = shard_ids == j
            out[rows] = self._index_shard(int(j))[positions[rows] - self._index_starts[j]]
        return out

    def sample_sources(self, start: int, count: int) -> list[str]:
        """Which source each global sample comes from (for per-domain metrics)."""
        source_ids, _ = split_entries(self.index_entries(start, count))
        return [self.source_names[int(s)] for s in source_ids]

    def prefetch_samples(self, start: int, count: int) -> int:
        """Start background downloads of the shards global samples start..start+count read,
        on a remote store (a local one reads in place: nothing to do). Returns how many
        downloads were started; errors stay with the shard's reader (see the docstring)."""
        if not self.remote or count <= 0:
            return 0
        source_ids, windows = split_entries(self.index_entries(start, count))
        started = 0
        for sid in np.unique(source_ids):
            stream = self._streams[(self.source_names[int(sid)], "train")]
            rows = windows[source_ids == sid]
            for sh in np.unique(np.searchsorted(stream.starts, rows, side="right") - 1):
                entry = stream.shards[int(sh)]
                with self._lock:
                    if entry.key in self._arrays or entry.key in self._pending:
                        continue
                    future: Future = Future()
                    self._pending[entry.key] = future
                    self._speculative.add(entry.key)
                    self.prefetch_stats["started"] += 1
                    if self._executor is None:
                        self._executor = ThreadPoolExecutor(
                            PREFETCH_WORKERS, thread_name_prefix=f"shard-prefetch-{self.key}")
                self._executor.submit(self._fetch, entry.key, entry.bytes, entry.sha256,
                                      self.manifest.dtype, future)
                started += 1
        return started

    def close(self) -> None:
        """Stop the speculative downloads (those running finish; queued ones are dropped)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:  # queued and never run: their readers fetch them themselves
            dropped = [(k, self._pending.pop(k)) for k in self._speculative]
            self._speculative.clear()
        for _, future in dropped:
            future.set_exception(DataError("speculative shard fetch dropped (mix closed)"))

    # --- held-out windows (evaluation) ------------------------------------------------

    def heldout_windows(self, source: str) -> int:
        self.manifest.source(source)
        return self._streams[(source, "heldout")].windows

    def heldout_samples(self, source: str, start: int, count: int) -> np.ndarray:
        """Held-out windows `start .. start+count` of `source`, in order: int64 [count, window]."""
        available = self.heldout_windows(source)
        if start < 0 or start + count > available:
            raise DataError(
                f"source {source!r} has {available} held-out windows; asked for "
                f"{start}..{start + count}"
            )
        return self._gather(source, "heldout", np.arange(start, start + count, dtype=np.int64))

    def heldout_batches(self, source: str, *, batch_size: int, n_batches: int | None = None) -> Iterator:
        """LongTensor batches [batch_size, seq_len + 1] of `source`'s held-out windows, always
        the same ones in the same order; at most `n_batches` (default: all that fit)."""
        import torch

        fit = self.heldout_windows(source) // batch_size
        for b in range(fit if n_batches is None else min(n_batches, fit)):
            yield torch.from_numpy(self.heldout_samples(source, b * batch_size, batch_size))

    # --- tokenizer --------------------------------------------------------------------

    def tokenizer(self):
        """The mix's `tokenizers.Tokenizer` (checked against the manifest's SHA-256)."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            entry = self.manifest.tokenizer
            data = self.store.get_bytes(entry.key)
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CorruptShardError(entry.key, "does not match its manifest SHA-256",
                                        what="tokenizer")
            self._tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        return self._tokenizer

    def decode(self, ids) -> str:
        return self.tokenizer().decode([int(i) for i in ids], skip_special_tokens=False)

    # --- integrity --------------------------------------------------------------------

    def verify(self) -> int:
        """Check every artifact the manifest lists (tokenizer, sample index, every shard)
        against its SHA-256 and size; returns bytes read. CorruptShardError names the first
        one that does not match."""
        entry = self.manifest.tokenizer
        try:
            data = self.store.get_bytes(entry.key)
        except ObjectNotFound:
            raise CorruptShardError(entry.key, f"tokenizer missing from {self.store.uri}",
                                    what="tokenizer") from None
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CorruptShardError(entry.key, "does not match its manifest SHA-256",
                                    what="tokenizer")
        index = self.manifest.sample_index
        for part in index.parts():
            self._load_verified(part.key, part.bytes, part.sha256, "<i8", what="sample index")
        total = len(data) + index.bytes
        for s in self.manifest.sources:
            for shard in s.shards:
                total += self._load(shard.key, shard.bytes, shard.sha256).nbytes
        return total

    # --- internals --------------------------------------------------------------------

    def _gather(self, source: str, split: Split, windows: np.ndarray) -> np.ndarray:
        stream = self._streams[(source, split)]
        if len(windows) and (windows.min() < 0 or windows.max() >= stream.windows):
            raise DataError(f"window out of range for {source}/{split} ({stream.windows} windows)")
        shard_ids = np.searchsorted(stream.starts, windows, side="right") - 1
        out = np.empty((len(windows), self.window), dtype=np.int64)
        for sh in np.unique(shard_ids):
            entry = stream.shards[int(sh)]
            tokens = self._load(entry.key, entry.bytes, entry.sha256)
            rows = shard_ids == sh
            n = entry.tokens // self.window
            out[rows] = tokens[: n * self.window].reshape(n, self.window)[windows[rows] - stream.starts[sh]]
        return out

    def _index_shard(self, j: int) -> np.ndarray:
        """Index shard j, verified; a reader keeps the last INDEX_CACHE of them (a rank reads
        its samples in order, so one shard serves ~shard_samples / world samples)."""
        with self._lock:
            cached = self._index_cache.get(j)
        if cached is not None:
            return cached
        part = self._index_parts[j]
        array = self._load_verified(part.key, part.bytes, part.sha256, "<i8", what="sample index")
        with self._lock:
            self._index_cache[j] = array
            while len(self._index_cache) > INDEX_CACHE:
                self._index_cache.pop(next(iter(self._index_cache)))
        return array

    def _load(self, key: str, size: int, sha256: str, dtype: str | None = None) -> np.ndarray:
        dtype = dtype or self.manifest.dtype
        with self._lock:
            array = self._arrays.get(key)
            if array is not None:
                return array
            future = self._pending.get(key)
            owner = future is None
            if owner:
                future = self._pending[key] = Future()
                self.prefetch_stats["on_demand"] += self.remote
            else:
                self.prefetch_stats["waited"] += 1
        if owner:
            self._fetch(key, size, sha256, dtype, future)
        try:
            return future.result()
        except BaseException:
            if owner:
                raise
            return self._load(key, size, sha256, dtype)  # the speculative fetch failed: retry

    def _fetch(self, key: str, size: int, sha256: str, dtype: str, future: Future) -> None:
        """Load one shard into `future` (and the cache); never raises (the reader does)."""
        try:
            array = self._load_verified(key, size, sha256, dtype)
        except BaseException as e:
            with self._lock:
                self._pending.pop(key, None)
                self._speculative.discard(key)
            future.set_exception(e)
            if threading.current_thread().name.startswith("shard-prefetch"):
                log.info("speculative fetch of %s failed (its reader retries): %s", key, e)
            return
        with self._lock:
            self._arrays[key] = array
            self._pending.pop(key, None)
            self._speculative.discard(key)
        future.set_result(array)

    def _load_verified(self, key: str, size: int, sha256: str, dtype: str, *,
                       what: str = "shard") -> np.ndarray:
        path = self.store.local_path(key)
        if path is None:  # a remote store: a verified copy in the local cache
            if self._cache_dir is None:
                raise DataError(f"data mix {self.key} is in a remote store ({self.store.uri}) "
                                "and no local cache directory was given for its shards")
            path = self._cache_dir / key
            if not _matches(path, size, sha256):
                self._download(key, path, what=what)
                _verify_file(key, path, size, sha256, what=what)
        else:
            _verify_file(key, path, size, sha256, what=what)
        if size == 0:
            return np.empty(0, dtype=dtype)
        return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")

    def _download(self, key: str, path: Path, *, what: str = "shard") -> None:
        # Several ranks on a node may fetch the same shard: each downloads to its own temp
        # name and the rename is atomic.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            self.store.get_file(key, tmp)
        except ObjectNotFound:
            raise CorruptShardError(key, f"missing from the store {self.store.uri}",
                                    what=what) from None
        os.replace(tmp, path)


def _matches(path: Path, size: int, sha256: str) -> bool:
    return path.is_file() and path.stat().st_size == size and sha256_file(path) == sha256


def _verify_file(key: str, path: Path, size: int, sha256: str, *, what: str = "shard") -> None:
    if not path.is_file():
        raise CorruptShardError(key, f"missing ({path})", what=what)
    actual = path.stat().st_size
    if actual != size:
        raise CorruptShardError(key, f"{actual} bytes, manifest says {size}", what=what)
    digest = sha256_file(path)
    if digest != sha256:
        raise CorruptShardError(key, f"sha256 {digest[:16]}..., manifest says {sha256[:16]}...",
                                what=what)


@dataclass(frozen=True)
class MixRef:
    """Where a published mix lives: what the `data_mix` asset hands to downstream assets."""

    store_uri: str
    key: str
    endpoint_url: str | None = None

    def open(self) -> Mix:
        from fm_pipeline.storage import open_store

        return open_mix(open_store(self.store_uri, endpoint_url=self.endpoint_url), self.key)
