"""Token shards: fixed-size files of little-endian token ids, each with a SHA-256 and count.

A shard holds a whole number of sample windows (seq_len + 1 tokens), so a sample never
straddles two files; only a stream's last shard is shorter (a stream is one clean part's
split: token_shards cuts each part on its own, fm_pipeline.data.shard_stages). Uploads run on a small thread
pool so that tokenization never waits on the store.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from fm_pipeline.data.errors import CorruptShardError, DataError
from fm_pipeline.data.manifest import ShardEntry, Split, shard_key
from fm_pipeline.storage import ObjectStore


def shard_capacity(shard_tokens: int, window: int) -> int:
    """Tokens per shard: `shard_tokens` rounded down to whole windows."""
    if shard_tokens < window:
        raise DataError(
            f"data.shard_tokens ({shard_tokens}) must hold at least one sample window "
            f"(seq_len + 1 = {window} tokens)"
        )
    return shard_tokens // window * window


def encode_shard(tokens: np.ndarray) -> tuple[bytes, str]:
    data = np.ascontiguousarray(tokens).astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes()
    return data, hashlib.sha256(data).hexdigest()


def decode_shard(data: bytes | memoryview | np.ndarray, dtype: str) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))


def verify_shard_bytes(entry: ShardEntry, data: bytes | memoryview) -> None:
    """Raise CorruptShardError naming the shard when size or SHA-256 differ from the manifest."""
    if len(data) != entry.bytes:
        raise CorruptShardError(entry.key, f"{len(data)} bytes, manifest says {entry.bytes}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise CorruptShardError(entry.key, f"sha256 {digest[:16]}..., manifest says {entry.sha256[:16]}...")


class ShardWriter:
    """Appends token ids for one (source, split) stream and cuts them into shards.

        writer = ShardWriter(store, mix_key=key, source="code", split="train", ...)
        writer.append(ids)            # any number of times
        entries = writer.close()      # uploads the tail, waits for every upload
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        mix_key: str,
        source: str,
        split: Split,
        capacity: int,
        dtype: str,
        uploader: ThreadPoolExecutor,
        part: int = 0,
    ):
        self.store, self.mix_key, self.source, self.split = store, mix_key, source, split
        self.part = part
        self.capacity, self.dtype, self._uploader = capacity, np.dtype(dtype), uploader
        self._buffer = np.empty(capacity, dtype=self.dtype)
        self._filled = 0
        self._pending: list[Future[ShardEntry]] = []
        self.tokens = 0

    def append(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids)
        pos = 0
        while pos < len(ids):
            take = min(self.capacity - self._filled, len(ids) - pos)
            self._buffer[self._filled:self._filled + take] = ids[pos:pos + take]
            self._filled += take
            pos += take
            if self._filled == self.capacity:
                self._flush()
        self.tokens += len(ids)

    def _flush(self) -> None:
        if not self._filled:
            return
        tokens = self._buffer[:self._filled].copy()
        key = shard_key(self.mix_key, self.source, self.split, len(self._pending), self.part)
        self._pending.append(self._uploader.submit(_upload, self.store, key, self.split, tokens))
        self._filled = 0

    def close(self) -> list[ShardEntry]:
        self._flush()
        return [f.result() for f in self._pending]


def _upload(store: ObjectStore, key: str, split: Split, tokens: np.ndarray) -> ShardEntry:
    data, digest = encode_shard(tokens)
    store.put_bytes(data, key)
    return ShardEntry(key=key, split=split, tokens=len(tokens), bytes=len(data), sha256=digest)
