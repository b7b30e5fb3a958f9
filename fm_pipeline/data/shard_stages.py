"""Token shards as tasks: one per clean part, each encoding its part and cutting its own
shards, so that tokenizing fans out like cleaning and a stopped run resumes part by part.

    tasks = shard_tasks(job, store)                  # one per (source, clean part)
    shard_part(job, store, tasks[i])                 # its shards, then its receipt
    receipt = finish_shards(job, store, tasks)       # the ShardsReceipt, in part order

A task's shards are named by its part (`shards/<source>/<split>-p<part>-<n>.bin`) and its
receipt (`shards/tasks/<source>-<part>.json`) is written last, naming the tokenizer it
encoded with: a task whose receipt names the stored tokenizer is done, any other is redone.
Each part's stream is cut on its own: its last shard is short, and the tokens past its last
whole window (fewer than seq_len + 1) are never sampled, as a stream's tail never was.
Memory per task is one part's batch of documents and one shard.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from fm_pipeline.config import JobSpec
from fm_pipeline.data.corpus import (
    CleanReceipt,
    ShardsReceipt,
    clean_parts,
    part_texts,
    read_receipt,
    write_receipt,
)
from fm_pipeline.data.errors import DataError
from fm_pipeline.data.manifest import (
    ShardEntry,
    TokenizerEntry,
    clean_receipt_key,
    mix_key,
    mix_prefix,
    shards_receipt_key,
    token_dtype,
    tokenizer_key,
)
from fm_pipeline.data.progress import NO_PROGRESS, ProgressSink
from fm_pipeline.data.shards import ShardWriter, shard_capacity
from fm_pipeline.data.tokenizer import encode_stream, eos_id
from fm_pipeline.storage import ObjectNotFound, ObjectStore

ENCODE_BATCH_DOCS = 128


@dataclass(frozen=True)
class ShardTask:
    source: str
    part: int  # the clean part's position in its source
    key: str  # the clean part's object key

    @property
    def name(self) -> str:
        return f"{self.source}_{self.part:05d}"


class ShardPartReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mix_key: str
    tokenizer_sha256: str
    source: str
    part: int
    documents: int
    shards: list[ShardEntry]  # train then heldout


def part_receipt_key(key: str, task: ShardTask) -> str:
    return f"{mix_prefix(key)}/shards/tasks/{task.source}-{task.part:05d}.json"


def stored_tokenizer(store: ObjectStore, key: str):
    """(its entry, the Tokenizer) of the mix's stored tokenizer, parsed once; the entry's
    SHA-256 names what the shards were cut with."""
    from tokenizers import Tokenizer

    try:
        data = store.get_bytes(tokenizer_key(key))
    except ObjectNotFound:
        raise DataError(f"mix {key} has no tokenizer yet; run the tokenizer stage first") from None
    tok = Tokenizer.from_str(data.decode("utf-8"))
    return TokenizerEntry(key=tokenizer_key(key), sha256=hashlib.sha256(data).hexdigest(),
                          vocab_size=tok.get_vocab_size(), eos_id=eos_id(tok)), tok


def tokenizer_entry(store: ObjectStore, key: str) -> TokenizerEntry:
    return stored_tokenizer(store, key)[0]


def load_tokenizer(store: ObjectStore, key: str):
    return stored_tokenizer(store, key)[1]


def shards_done(job: JobSpec, store: ObjectStore) -> ShardsReceipt | None:
    """The ShardsReceipt when it was cut with the stored tokenizer, else None."""
    key = mix_key(job)
    done = read_receipt(store, shards_receipt_key(key), ShardsReceipt)
    if done is not None and done.tokenizer_sha256 == tokenizer_entry(store, key).sha256:
        return done
    return None


def shard_tasks(job: JobSpec, store: ObjectStore) -> list[ShardTask]:
    """One task per clean part of every source, in the spec's source order."""
    key = mix_key(job)
    if read_receipt(store, clean_receipt_key(key), CleanReceipt) is None:
        raise DataError(f"mix {key} has no clean corpus yet; run clean_documents first")
    return [ShardTask(source=s.name, part=i, key=part)
            for s in job.data.sources for i, part in enumerate(clean_parts(store, key, s.name))]


def shard_part(job: JobSpec, store: ObjectStore, task: ShardTask, *,
               progress: ProgressSink = NO_PROGRESS) -> ShardPartReceipt:
    """Encode one clean part (train, then held-out) into its shards; skipped when its
    receipt names the stored tokenizer."""
    key = mix_key(job)
    entry, tok = stored_tokenizer(store, key)
    receipt_key = part_receipt_key(key, task)
    done = read_receipt(store, receipt_key, ShardPartReceipt)
    if done is not None and done.tokenizer_sha256 == entry.sha256:
        return done
    tok.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is text, not EOS
    dtype = token_dtype(job.model_cfg.vocab_size)
    capacity = shard_capacity(job.data.shard_tokens, job.training.seq_len + 1)
    shards: list[ShardEntry] = []
    documents = 0
    label = f"tokenize {task.name}"
    progress.start(label, total=None, unit="docs")
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="shard-upload") as uploader:
        for split in ("train", "heldout"):
            writer = ShardWriter(store, mix_key=key, source=task.source, split=split,
                                 capacity=capacity, dtype=dtype, uploader=uploader,
                                 part=task.part)
            batches = part_texts(store, task.key, split=split, batch_docs=ENCODE_BATCH_DOCS)
            for ids, docs in encode_stream(tok, batches, eos=entry.eos_id, dtype=dtype):
                writer.append(ids)
                documents += docs
                progress.advance(label, docs)
            shards += writer.close()
    progress.finish(label, f"{sum(s.tokens for s in shards):,} tokens in {len(shards)} shards")
    receipt = ShardPartReceipt(mix_key=key, tokenizer_sha256=entry.sha256, source=task.source,
                               part=task.part, documents=documents, shards=shards)
    write_receipt(store, receipt_key, receipt)
    return receipt


def finish_shards(job: JobSpec, store: ObjectStore, tasks: list[ShardTask]) -> ShardsReceipt:
    """Every task's shards, per source in part order (train, then held-out): the receipt
    the publish stage reads. Refuses a task without a receipt for the stored tokenizer."""
    key = mix_key(job)
    entry = tokenizer_entry(store, key)
    parts: dict[str, list[ShardPartReceipt]] = {s.name: [] for s in job.data.sources}
    for task in tasks:
        done = read_receipt(store, part_receipt_key(key, task), ShardPartReceipt)
        if done is None or done.tokenizer_sha256 != entry.sha256:
            raise DataError(f"shard task {task.name} of mix {key} has not finished with the "
                            f"stored tokenizer; re-run token_shards")
        parts[task.source].append(done)
    shards = {source: [s for split in ("train", "heldout") for r in done for s in r.shards
                       if s.split == split]
              for source, done in parts.items()}
    receipt = ShardsReceipt(
        mix_key=key, tokenizer_sha256=entry.sha256,
        dtype=token_dtype(job.model_cfg.vocab_size),
        capacity=shard_capacity(job.data.shard_tokens, job.training.seq_len + 1),
        shards=shards)
    write_receipt(store, shards_receipt_key(key), receipt)
    return receipt
