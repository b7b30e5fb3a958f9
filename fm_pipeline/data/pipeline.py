"""Prepare a data mix: clean -> tokenizer -> token shards -> published manifest + sample index.

    from fm_pipeline.data import prepare_mix
    manifest = prepare_mix(job, store)         # idempotent: a published mix returns at once

Each stage is a function the Dagster assets call one by one (`clean_stage`,
`tokenizer_stage`, `shards_stage`, `publish_stage`). A stage ends by writing its receipt (or
artifact) and skips itself when that exists, so a failed run resumes where it stopped. The
manifest is written last: until then nothing is published, and `open_mix` refuses the key.
"""

from __future__ import annotations

import hashlib
import sys
from datetime import UTC, datetime

from fm_pipeline.config import JobSpec
from fm_pipeline.data import clean_stages as stages
from fm_pipeline.data import shard_stages
from fm_pipeline.data.corpus import (
    CleanReceipt,
    ShardsReceipt,
    iter_clean_texts,
    read_receipt,
)
from fm_pipeline.data.errors import DataError
from fm_pipeline.data.manifest import (
    IndexShard,
    MixManifest,
    SampleIndexEntry,
    SourceEntry,
    TokenizerEntry,
    clean_receipt_key,
    manifest_key,
    mix_key,
    mix_prefix,
    sample_index_key,
    sample_index_shard_key,
    shards_receipt_key,
    tokenizer_key,
)
from fm_pipeline.data.mix import open_mix
from fm_pipeline.data.progress import NO_PROGRESS, ProgressSink
from fm_pipeline.data.sample_index import SOURCE_SHIFT, index_shards, samples_per_source
from fm_pipeline.data.shard_stages import tokenizer_entry as _tokenizer_entry
from fm_pipeline.data.sources import fingerprint, list_source_files
from fm_pipeline.data.tokenizer import train_bpe
from fm_pipeline.storage import ObjectStore

# The tokenizer learns from at most this many characters (split across sources by weight):
# BPE merges converge long before a web-scale corpus is read.
TOKENIZER_TRAIN_CHARS = 200_000_000


def prepare_mix(
    job: JobSpec, store: ObjectStore, *, force: bool = False, progress: ProgressSink = NO_PROGRESS
) -> MixManifest:
    """Run every stage that has not run yet and publish the mix; returns its manifest."""
    key = mix_key(job)
    if force:
        unpublish(store, key)
    elif store.exists(manifest_key(key)):
        manifest = open_mix(store, key).manifest
        _check_fingerprints(job, store, manifest.provenance.get("fingerprints", {}), key)
        return manifest
    clean_stage(job, store, progress=progress)
    tokenizer_stage(job, store, progress=progress)
    shards_stage(job, store, progress=progress)
    return publish_stage(job, store, progress=progress)


def unpublish(store: ObjectStore, key: str) -> int:
    """Remove a mix: the manifest first, so that no reader sees a half-deleted mix."""
    store.delete(manifest_key(key))
    return store.delete_prefix(f"{mix_prefix(key)}/")


# --- stage 1: clean documents ----------------------------------------------------------

def clean_stage(job: JobSpec, store: ObjectStore, *, progress: ProgressSink = NO_PROGRESS) -> CleanReceipt:
    """Every cleaning task one after the other, in this process (clean_stages.py's order);
    the Dagster asset fans the same tasks out over its executor's processes."""
    key = mix_key(job)
    done = read_receipt(store, clean_receipt_key(key), CleanReceipt)
    if done is not None:
        _check_fingerprints(job, store, done.fingerprints, key)
        return done
    plan = stages.plan_clean(job, store)
    for source in job.data.sources:
        task = f"clean {source.name}"
        progress.start(task, total=None, unit="docs")
        receipts = [stages.clean_task(job, store, plan, t, on_document=lambda name=task: progress.advance(name))
                    for t in plan.of_source(source.name)]
        progress.finish(task, f"{sum(r.kept for r in receipts)} kept before dedup, "
                              f"{len(receipts)} task(s)")
    bands = stages.band_tasks(job)
    if bands:
        progress.start("near-dedup buckets", total=len(bands), unit="band groups")
        for b in bands:
            stages.bucket_task(job, store, plan, b)
            progress.advance("near-dedup buckets")
        progress.finish("near-dedup buckets")
    progress.start("dedup", total=None)
    dedup = stages.cluster_stage(job, store, plan)
    for t in plan.tasks:
        stages.filter_task(job, store, plan, t)
    receipt = stages.finish_clean(job, store, plan)
    progress.finish("dedup", f"removed {dedup.removed or 'nothing'} of {dedup.documents:,}")
    return receipt


def _check_fingerprints(job: JobSpec, store: ObjectStore, recorded: dict[str, str],
                        key: str) -> None:
    for source in job.data.sources:
        now = fingerprint(list_source_files(source, store))
        if recorded.get(source.name, now) != now:
            raise DataError(
                f"source {source.name!r} ({source.uri}) changed since mix {key} was prepared "
                f"(files fingerprint {recorded[source.name]} -> {now}); re-run with force "
                "(`fm data prepare --force`) to rebuild it"
            )


# --- stage 2: tokenizer -----------------------------------------------------------------

def tokenizer_stage(job: JobSpec, store: ObjectStore, *, progress: ProgressSink = NO_PROGRESS) -> TokenizerEntry:
    key = mix_key(job)
    if store.exists(tokenizer_key(key)):
        return _tokenizer_entry(store, key)
    _require(store, clean_receipt_key(key), CleanReceipt, "clean_documents")
    progress.start("train tokenizer", total=None)
    tok = train_bpe(_tokenizer_corpus(job, store, key), vocab_size=job.model_cfg.vocab_size)
    store.put_bytes(tok.to_str().encode("utf-8"), tokenizer_key(key))
    entry = _tokenizer_entry(store, key)
    progress.finish("train tokenizer", f"vocab {entry.vocab_size}")
    return entry


def _tokenizer_corpus(job: JobSpec, store: ObjectStore, key: str):
    for source in job.data.sources:
        budget = TOKENIZER_TRAIN_CHARS * source.weight
        for texts in iter_clean_texts(store, key, source.name, split="train"):
            for text in texts:
                yield text
                budget -= len(text)
            if budget <= 0:
                break


# --- stage 3: token shards -------------------------------------------------------------

def shards_stage(job: JobSpec, store: ObjectStore, *, progress: ProgressSink = NO_PROGRESS) -> ShardsReceipt:
    """Every shard task (one per clean part) in this process, then the receipt; Dagster's
    token_shards runs the same tasks as steps (shard_stages)."""
    done = shard_stages.shards_done(job, store)
    if done is not None:
        return done
    _require(store, clean_receipt_key(mix_key(job)), CleanReceipt, "clean_documents")
    tasks = shard_stages.shard_tasks(job, store)
    for task in tasks:
        shard_stages.shard_part(job, store, task, progress=progress)
    return shard_stages.finish_shards(job, store, tasks)


# --- stage 4: publish ------------------------------------------------------------------

def _write_index(store: ObjectStore, key: str, counts: dict[str, int], windows: dict[str, int],
                 *, seed: int) -> SampleIndexEntry:
    """The global sample index, built and uploaded one shard at a time."""
    whole = hashlib.sha256()
    shards = []
    for j, entries in enumerate(index_shards(counts, windows, seed=seed)):
        data = entries.astype("<i8").tobytes()
        whole.update(data)
        store.put_bytes(data, sample_index_shard_key(key, j))
        shards.append(IndexShard(key=sample_index_shard_key(key, j), samples=len(entries),
                                 bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))
    return SampleIndexEntry(key=sample_index_key(key), samples=sum(s.samples for s in shards),
                            bytes=sum(s.bytes for s in shards), sha256=whole.hexdigest(),
                            source_shift=SOURCE_SHIFT, shards=shards)


def publish_stage(job: JobSpec, store: ObjectStore, *, progress: ProgressSink = NO_PROGRESS) -> MixManifest:
    key = mix_key(job)
    if store.exists(manifest_key(key)):
        return open_mix(store, key).manifest
    clean = _require(store, clean_receipt_key(key), CleanReceipt, "clean_documents")
    shards = _require(store, shards_receipt_key(key), ShardsReceipt, "token_shards")
    tok = _tokenizer_entry(store, key)
    if shards.tokenizer_sha256 != tok.sha256:
        raise DataError(
            f"mix {key}: the shards were cut with another tokenizer ({shards.tokenizer_sha256[:12]}) "
            f"than the stored one ({tok.sha256[:12]}); re-run with force"
        )
    progress.start("publish mix", total=None)
    window = job.training.seq_len + 1
    sources = job.data.sources
    windows = {s.name: shards.windows(s.name, "train", window) for s in sources}
    counts = samples_per_source(windows, {s.name: s.weight for s in sources})
    index = _write_index(store, key, counts, windows, seed=job.data.seed)
    entries = []
    for s in sources:
        train, heldout = shards.tokens(s.name, "train"), shards.tokens(s.name, "heldout")
        entries.append(SourceEntry(
            name=s.name, uri=s.uri, format=s.format, weight=s.weight,
            documents=clean.sources[s.name],
            train_tokens=train, heldout_tokens=heldout,
            train_windows=windows[s.name],
            heldout_windows=shards.windows(s.name, "heldout", window),
            samples=counts[s.name], epochs=round(counts[s.name] * window / train, 6),
            shards=shards.shards[s.name],
        ))
    manifest = MixManifest(
        key=key,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seq_len=job.training.seq_len, window=window, vocab_size=job.model_cfg.vocab_size,
        dtype=shards.dtype, shard_tokens=job.data.shard_tokens, seed=job.data.seed,
        tokenizer=tok, sources=entries,
        sample_index=index,
        data_spec=job.data.model_dump(mode="json"),
        provenance={"fingerprints": clean.fingerprints, "python": sys.version.split()[0],
                    "dedup_ratio": round(clean.dedup_ratio(), 6)},
    )
    store.put_bytes(manifest.to_json(), manifest_key(key))  # the commit point
    progress.finish("publish mix", f"{index.samples:,} samples, key {key}")
    return manifest


def _require(store: ObjectStore, key: str, model, stage: str):
    receipt = read_receipt(store, key, model)
    if receipt is None:
        raise DataError(f"stage {stage} has not finished ({store.uri_of(key)} is missing); run it first")
    return receipt
