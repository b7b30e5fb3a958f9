"""The clean corpus in the store: parquet parts per source (one per cleaning task), plus
the stage receipts.

A receipt is the small JSON a stage writes last; its presence means the stage finished, so
a re-run (or the next Dagster asset) can pick up where the previous one stopped.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, ValidationError

from fm_pipeline.data.errors import DataError
from fm_pipeline.data.manifest import DocumentCounts, ShardEntry, clean_key, clean_receipt_key
from fm_pipeline.storage import ObjectNotFound, ObjectStore

ROWS_PER_GROUP = 4096


class CleanReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mix_key: str
    sources: dict[str, DocumentCounts]
    fingerprints: dict[str, str]
    examples: dict[str, dict[str, str]]  # source -> reason -> first dropped doc_id
    parts: dict[str, list[str]] = {}  # source -> clean parts in order (none: one file, before tasks)
    tasks: int = 0  # cleaning tasks it took

    def dedup_ratio(self, source: str | None = None) -> float:
        """Duplicates dropped / documents read (whole mix when `source` is None)."""
        counts = [self.sources[source]] if source else list(self.sources.values())
        read = sum(c.read for c in counts)
        return sum(c.dropped.get("duplicate", 0) for c in counts) / read if read else 0.0


class ShardsReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mix_key: str
    tokenizer_sha256: str
    dtype: str
    capacity: int
    shards: dict[str, list[ShardEntry]]  # source -> shards (train then heldout)

    def tokens(self, source: str, split: str) -> int:
        return sum(s.tokens for s in self.shards[source] if s.split == split)

    def windows(self, source: str, split: str, window: int) -> int:
        """Whole sample windows: each shard's (a part's last shard ends with a remainder)."""
        return sum(s.tokens // window for s in self.shards[source] if s.split == split)


def read_receipt(store: ObjectStore, key: str, model: type[BaseModel]):
    """The receipt at `key`, or None when the stage has not finished."""
    try:
        raw = store.get_bytes(key)
    except ObjectNotFound:
        return None
    try:
        return model.model_validate(json.loads(raw))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as e:
        raise DataError(f"unreadable stage receipt {store.uri_of(key)}: {e}") from None


def write_receipt(store: ObjectStore, key: str, receipt: BaseModel) -> None:
    store.put_bytes(json.dumps(receipt.model_dump(mode="json"), indent=1).encode(), key)


def clean_parts(store: ObjectStore, mix_key: str, source: str) -> list[str]:
    """The keys of a source's clean parts, in corpus order."""
    receipt = read_receipt(store, clean_receipt_key(mix_key), CleanReceipt)
    if receipt is None:
        raise DataError(f"clean corpus of mix {mix_key} is missing ({store.uri_of(clean_receipt_key(mix_key))}); "
                        "re-run clean_documents")
    return receipt.parts.get(source) or [clean_key(mix_key, source)]


def iter_clean_texts(
    store: ObjectStore, mix_key: str, source: str, *, split: str | None = None, batch_docs: int = 1024
) -> Iterator[list[str]]:
    """Batches of a source's clean document texts, in corpus order, optionally one split."""
    for key in clean_parts(store, mix_key, source):
        yield from part_texts(store, key, split=split, batch_docs=batch_docs)


def part_texts(store: ObjectStore, key: str, *, split: str | None, batch_docs: int = 1024):
    """Batches of one clean part's document texts, in order, optionally one split."""
    import pyarrow.parquet as pq

    missing = DataError(f"clean corpus {store.uri_of(key)} is missing; re-run clean_documents")
    local = store.local_path(key)
    if local is not None:
        if not local.is_file():
            raise missing
        handle = local
    else:
        try:
            handle = io.BytesIO(store.get_bytes(key))
        except ObjectNotFound:
            raise missing from None
    for batch in pq.ParquetFile(handle).iter_batches(batch_size=batch_docs, columns=["text", "split"]):
        texts = batch.column(0).to_pylist()
        if split is not None:
            splits = batch.column(1).to_pylist()
            texts = [t for t, s in zip(texts, splits) if s == split]
        if texts:
            yield texts
