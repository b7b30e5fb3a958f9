"""The mix manifest: what a published data mix holds, and where each piece lives.

A mix lives in the object store under `data/<mix_key>/`:

    data/<key>/clean/<source>/part-00000.parquet   cleaned documents (doc_id, text, split),
                                           one part per cleaning task
    data/<key>/clean/receipt.json          per-source cleaning counts (stage done)
    data/<key>/tokenizer.json              byte-level BPE (the `tokenizers` format)
    data/<key>/shards/<source>/<split>-00000.bin   token ids, little-endian, `dtype`
    data/<key>/shards/receipt.json         shard table (stage done)
    data/<key>/sample_index/NNNNN.bin      the pre-shuffled global sample index (int64), in shards
    data/<key>/manifest.json               written LAST: a mix without it is not published

`mix_key(job)` is a content hash of the data spec, the vocabulary size and the sequence
length, so every job that agrees on those finds the same mix.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MIX_FORMAT = "fm-mix/1"
EOS_TOKEN = "<|endoftext|>"


# Data options added after mixes were published, with the value that means "off".
_LATER_OPTIONS = {"near_dedup": None, "quality": None, "mask_pii": False}
_LATER_SOURCE_OPTIONS = {"symlinks": "refuse"}


def mix_key(job) -> str:
    """Content hash (16 hex chars) of the data spec + vocab_size + seq_len of a JobSpec."""
    data = job.data.model_dump(mode="json")
    data.pop("checks", None)  # what the checks warn about, not what the mix holds
    for option in ("task_bytes", "workers"):  # how cleaning is split and run: same result
        data.pop(option, None)
    for option, off in _LATER_OPTIONS.items():  # off: the key mixes had before the option
        if data.get(option, off) == off:
            data.pop(option, None)
    for source in data["sources"]:
        for option, off in _LATER_SOURCE_OPTIONS.items():
            if source.get(option, off) == off:
                source.pop(option, None)
    spec = {
        "format": MIX_FORMAT,
        "data": data,
        "vocab_size": job.model_cfg.vocab_size,
        "seq_len": job.training.seq_len,
    }
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def mix_prefix(key: str) -> str:
    return f"data/{key}"


def manifest_key(key: str) -> str:
    return f"{mix_prefix(key)}/manifest.json"


def tokenizer_key(key: str) -> str:
    return f"{mix_prefix(key)}/tokenizer.json"


def clean_key(key: str, source: str) -> str:
    return f"{mix_prefix(key)}/clean/{source}.parquet"


def clean_receipt_key(key: str) -> str:
    return f"{mix_prefix(key)}/clean/receipt.json"


def shard_key(key: str, source: str, split: str, index: int, part: int = 0) -> str:
    """A shard of one clean part's stream (token_shards cuts each part on its own)."""
    return f"{mix_prefix(key)}/shards/{source}/{split}-p{part:05d}-{index:05d}.bin"


def shards_receipt_key(key: str) -> str:
    return f"{mix_prefix(key)}/shards/receipt.json"


def sample_index_key(key: str) -> str:
    """The sample index's prefix; shard j is sample_index_shard_key(key, j)."""
    return f"{mix_prefix(key)}/sample_index"


def sample_index_shard_key(key: str, shard: int) -> str:
    return f"{sample_index_key(key)}/{shard:05d}.bin"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Split = Literal["train", "heldout"]


class ShardEntry(_Frozen):
    key: str
    split: Split
    tokens: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str


class DocumentCounts(_Frozen):
    """What cleaning did to one source: documents read, kept, and dropped per reason."""

    read: int = 0
    kept: int = 0
    heldout: int = 0
    chars_kept: int = 0
    dropped: dict[str, int] = Field(default_factory=dict)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class SourceEntry(_Frozen):
    name: str
    uri: str
    format: str
    weight: float
    documents: DocumentCounts
    train_tokens: int
    heldout_tokens: int
    train_windows: int = Field(description="non-overlapping seq_len+1 windows in the train split")
    heldout_windows: int
    samples: int = Field(description="entries of the global sample index drawn from this source")
    epochs: float = Field(description="samples x window / train_tokens: passes over the source")
    shards: list[ShardEntry]

    def split_shards(self, split: Split) -> list[ShardEntry]:
        return [s for s in self.shards if s.split == split]


class IndexShard(_Frozen):
    key: str
    samples: int
    bytes: int
    sha256: str


class SampleIndexEntry(_Frozen):
    key: str = Field(description="the index's prefix (its shards' folder); for a mix published "
                                 "before the index was sharded, its one file")
    samples: int
    sha256: str = Field(description="SHA-256 of the shards' bytes, in order")
    bytes: int
    source_shift: int = Field(description="entry = source_id << source_shift | window")
    shards: list[IndexShard] = Field(default_factory=list)

    def parts(self) -> list[IndexShard]:
        """The index's files in order (one, at `key`, for a mix without shards)."""
        return self.shards or [IndexShard(key=self.key, samples=self.samples, bytes=self.bytes,
                                          sha256=self.sha256)]


class TokenizerEntry(_Frozen):
    key: str
    sha256: str
    vocab_size: int
    eos_id: int


class MixManifest(_Frozen):
    format: Literal["fm-mix/1"] = MIX_FORMAT
    key: str
    created_at: str
    seq_len: int
    window: int = Field(description="tokens per sample: seq_len + 1 (inputs and shifted targets)")
    vocab_size: int = Field(description="the model's vocabulary; every token id is below it")
    dtype: Literal["uint16", "uint32"]
    shard_tokens: int
    seed: int
    tokenizer: TokenizerEntry
    sources: list[SourceEntry]
    sample_index: SampleIndexEntry
    data_spec: dict
    provenance: dict = Field(default_factory=dict)

    def source(self, name: str) -> SourceEntry:
        for s in self.sources:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.sources)
        raise KeyError(f"mix {self.key} has no source {name!r}; sources: {known}")

    @property
    def train_tokens(self) -> int:
        return sum(s.train_tokens for s in self.sources)

    def to_json(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), indent=1).encode()


def token_dtype(vocab_size: int) -> Literal["uint16", "uint32"]:
    """The most compact dtype that holds every id below `vocab_size`."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
