"""Cleaning and deduplication as tasks over groups of input files, each writing objects
to the store and a receipt last, so that a stage resumes task by task and the tasks of a
stage can run side by side (Dagster's executors fan them out: assets/data/clean.py).

    plan = plan_clean(job, store)                  # tasks: contiguous file groups per source
    for t in plan.tasks: clean_task(job, store, plan, t)       # read, normalise, filter, sign
    for b in band_tasks(job): bucket_task(job, store, plan, b) # near dedup: LSH pairs, verified
    cluster_stage(job, store, plan)                            # exact + near clusters -> decisions
    for t in plan.tasks: filter_task(job, store, plan, t)      # the clean parts
    finish_clean(job, store, plan)                             # the clean receipt (stage done)

Under data/<key>/clean/: `plan.json`; per task `tasks/<source>/<i>/` with `docs.parquet`
(doc_id, text, digest), `sigs.npy` (MinHash signatures, near dedup only) and
`receipt.json`; `dedup/pairs-<lo>-<hi>.npy` per band range, `dedup/<source>-<i>.npy`
(a decision per document) and `dedup/receipt.json`; the clean parts
`<source>/part-<i>.parquet` with `tasks/<source>/<i>/final.json`; `receipt.json` last.
Memory per task is bounded by its file group (`data.task_bytes`); the bucket and cluster
stages hold a few numbers per document (8 bytes per band in a bucket task; digest, label
and decision in the cluster stage), never the texts.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fm_pipeline.config import JobSpec
from fm_pipeline.data.clean import DocumentFilter, heldout_by_hash, text_digest
from fm_pipeline.data.corpus import CleanReceipt, read_receipt, write_receipt
from fm_pipeline.data.dedup import KEEP, KEEP_HELDOUT, REASONS, decide, exact_pairs, heldout_pick
from fm_pipeline.data.errors import DataError
from fm_pipeline.data.manifest import DocumentCounts, clean_receipt_key, mix_key, mix_prefix
from fm_pipeline.data.near_dedup import MinHasher, agreement, band_keys, candidate_pairs, shingles
from fm_pipeline.data.sources import fingerprint, iter_documents, list_source_files
from fm_pipeline.storage import ObjectNotFound, ObjectStore

BANDS_PER_TASK = 8  # a bucket task's share of the LSH bands


class _Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CleanTask(_Receipt):
    source: str
    index: int
    files: list[str]
    bytes: int
    fingerprint: str

    @property
    def name(self) -> str:
        return f"{self.source}-{self.index:05d}"


class CleanPlan(_Receipt):
    mix_key: str
    tasks: list[CleanTask]

    def of_source(self, source: str) -> list[CleanTask]:
        return [t for t in self.tasks if t.source == source]


class TaskReceipt(_Receipt):
    """What one cleaning task read, kept and dropped (before dedup)."""

    read: int
    kept: int
    dropped: dict[str, int]
    examples: dict[str, str]


class DedupReceipt(_Receipt):
    documents: int
    exact_pairs: int
    near_pairs: int
    removed: dict[str, int]
    heldout_picks: dict[str, str] = Field(default_factory=dict)  # source -> task forced


class FinalReceipt(_Receipt):
    """A clean part: the documents a task kept after dedup."""

    key: str
    counts: DocumentCounts
    examples: dict[str, str]


# --- keys ----------------------------------------------------------------------------------

def _clean_prefix(key: str) -> str:
    return f"{mix_prefix(key)}/clean"


def _task_prefix(key: str, task: CleanTask) -> str:
    return f"{_clean_prefix(key)}/tasks/{task.source}/{task.index:05d}"


def _pairs_key(key: str, bands: range) -> str:
    return f"{_clean_prefix(key)}/dedup/pairs-{bands.start:03d}-{bands.stop:03d}.npy"


def _decisions_key(key: str, task: CleanTask) -> str:
    return f"{_clean_prefix(key)}/dedup/{task.name}.npy"


def part_key(key: str, task: CleanTask) -> str:
    return f"{_clean_prefix(key)}/{task.source}/part-{task.index:05d}.parquet"


def clean_done(job: JobSpec, store: ObjectStore) -> bool:
    """Whether the clean receipt is written (the intermediates are gone by then)."""
    return store.exists(clean_receipt_key(mix_key(job)))


# --- plan ----------------------------------------------------------------------------------

def plan_clean(job: JobSpec, store: ObjectStore) -> CleanPlan:
    """The tasks of this mix's cleaning: each source's sorted files cut into contiguous groups
    of at most `data.task_bytes` (a larger file is a group of its own). Written once; a
    resumed run reuses the stored plan."""
    key = mix_key(job)
    plan_key = f"{_clean_prefix(key)}/plan.json"
    stored = read_receipt(store, plan_key, CleanPlan)
    if stored is not None:
        return stored
    tasks = []
    for source in job.data.sources:
        groups: list[list] = []
        size = 0
        for f in list_source_files(source, store):
            if not groups or (size + f.size > job.data.task_bytes and groups[-1]):
                groups.append([])
                size = 0
            groups[-1].append(f)
            size += f.size
        tasks += [CleanTask(source=source.name, index=i, files=[f.rel for f in g],
                            bytes=sum(f.size for f in g), fingerprint=fingerprint(g))
                  for i, g in enumerate(groups)]
    plan = CleanPlan(mix_key=key, tasks=tasks)
    write_receipt(store, plan_key, plan)
    return plan


def band_tasks(job: JobSpec) -> list[range]:
    """The bucket tasks' band ranges; none without near dedup."""
    spec = job.data.near_dedup
    if spec is None:
        return []
    return [range(lo, min(lo + BANDS_PER_TASK, spec.bands))
            for lo in range(0, spec.bands, BANDS_PER_TASK)]


# --- stage 1: clean a file group ---------------------------------------------------------

def clean_task(job: JobSpec, store: ObjectStore, plan: CleanPlan, task: CleanTask, *,
               on_document: Callable[[], None] | None = None) -> TaskReceipt:
    """Read the task's files; keep what the filters keep, with its digest and signature."""
    key = mix_key(job)
    prefix = _task_prefix(key, task)
    done = read_receipt(store, f"{prefix}/receipt.json", TaskReceipt)
    if done is not None:
        return done
    source = next(s for s in job.data.sources if s.name == task.source)
    wanted = set(task.files)
    files = [f for f in list_source_files(source, store) if f.rel in wanted]
    if len(files) != len(wanted) or fingerprint(files) != task.fingerprint:
        raise DataError(
            f"source {source.name!r} ({source.uri}) changed since mix {key}'s cleaning was "
            f"planned (task {task.name}: {len(wanted)} files, fingerprint {task.fingerprint}); "
            "re-run with force (`fm data prepare --force`) to rebuild it")
    judge = DocumentFilter.of(job.data)
    quality = judge.judges_quality(source.name, code=source.format == "python-code")
    near = job.data.near_dedup
    hasher = MinHasher(near.bands * near.rows, near.seed) if near else None
    ids, texts, digests, sigs = [], [], [], []
    read, dropped, examples = 0, Counter(), {}
    for doc in iter_documents(source, files):
        read += 1
        if on_document:
            on_document()
        text, reason = judge.judge(doc, quality=quality)
        if reason:
            dropped[reason] += 1
            examples.setdefault(reason, doc.doc_id)
            continue
        ids.append(doc.doc_id)
        texts.append(text)
        digests.append(text_digest(text))
        if hasher:
            sigs.append(hasher.signature(shingles(text, near.ngram)))
    _put_table(store, f"{prefix}/docs.parquet", {"doc_id": ids, "text": texts, "digest": digests})
    if hasher:
        width = near.bands * near.rows
        _put_array(store, f"{prefix}/sigs.npy",
                   np.stack(sigs) if sigs else np.empty((0, width), np.uint32))
    receipt = TaskReceipt(read=read, kept=len(ids), dropped=dict(sorted(dropped.items())),
                          examples=examples)
    write_receipt(store, f"{prefix}/receipt.json", receipt)
    return receipt


def task_receipts(job: JobSpec, store: ObjectStore, plan: CleanPlan) -> list[TaskReceipt]:
    key = mix_key(job)
    out = []
    for task in plan.tasks:
        receipt = read_receipt(store, f"{_task_prefix(key, task)}/receipt.json", TaskReceipt)
        if receipt is None:
            raise DataError(f"cleaning task {task.name} of mix {key} has not finished; run it first")
        out.append(receipt)
    return out


def _offsets(receipts: list[TaskReceipt]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([r.kept for r in receipts])]).astype(np.int64)


# --- stage 2: LSH buckets per band range ----------------------------------------------------

def bucket_task(job: JobSpec, store: ObjectStore, plan: CleanPlan, bands: range) -> int:
    """Candidate pairs that share one of `bands`, kept when their signatures agree on at
    least `threshold` of the entries; returns how many."""
    key = mix_key(job)
    out_key = _pairs_key(key, bands)
    if store.exists(out_key):
        return len(_get_array(store, out_key))
    near = job.data.near_dedup
    receipts = task_receipts(job, store, plan)
    offsets = _offsets(receipts)
    sig_of = _signature_reader(store, key, plan)
    keys = np.concatenate([band_keys(sig_of(i), rows=near.rows, bands=bands)
                           for i in range(len(plan.tasks))])
    pairs = candidate_pairs(keys, np.arange(len(keys), dtype=np.int64))
    verified = _verify(pairs, offsets, sig_of, near.threshold)
    _put_array(store, out_key, verified)
    return len(verified)


def _signature_reader(store: ObjectStore, key: str, plan: CleanPlan):
    @lru_cache(maxsize=8)  # verification walks pairs task by task; a few groups at a time
    def signatures(i: int) -> np.ndarray:
        return _get_array(store, f"{_task_prefix(key, plan.tasks[i])}/sigs.npy")
    return signatures


def _verify(pairs: np.ndarray, offsets: np.ndarray, sig_of, threshold: float) -> np.ndarray:
    if not len(pairs):
        return pairs
    task = np.searchsorted(offsets, pairs, side="right") - 1
    order = np.lexsort((task[:, 1], task[:, 0]))
    pairs, task = pairs[order], task[order]
    keep = np.zeros(len(pairs), bool)
    blocks = np.flatnonzero(np.any(np.diff(task, axis=0) != 0, axis=1)) + 1
    for lo, hi in zip(np.r_[0, blocks], np.r_[blocks, len(pairs)], strict=True):
        ta, tb = task[lo]
        a = sig_of(int(ta))[pairs[lo:hi, 0] - offsets[ta]]
        b = sig_of(int(tb))[pairs[lo:hi, 1] - offsets[tb]]
        keep[lo:hi] = agreement(a, b) >= threshold
    return np.unique(pairs[keep], axis=0)


# --- stage 3: clusters ---------------------------------------------------------------------

def cluster_stage(job: JobSpec, store: ObjectStore, plan: CleanPlan) -> DedupReceipt:
    """Exact and verified near pairs -> clusters -> a decision per document, per task."""
    key = mix_key(job)
    receipt_key = f"{_clean_prefix(key)}/dedup/receipt.json"
    done = read_receipt(store, receipt_key, DedupReceipt)
    if done is not None:
        return done
    receipts = task_receipts(job, store, plan)
    for source in job.data.sources:
        _require_documents(source, [r for t, r in zip(plan.tasks, receipts, strict=True)
                                    if t.source == source.name])
    offsets = _offsets(receipts)
    digests = np.concatenate([_digests(store, key, t) for t in plan.tasks]) \
        if plan.tasks else np.empty((0, 16), np.uint8)
    n = len(digests)
    exact = exact_pairs(digests)
    near = [_get_array(store, _pairs_key(key, b)) for b in band_tasks(job)]
    if any(p is None for p in near):
        raise DataError(f"mix {key}: a near-dedup bucket task has not finished; run it first")
    near_pairs = np.unique(np.concatenate(near), axis=0) if near else np.empty((0, 2), np.int64)
    reasons = decide(n, exact, near_pairs)
    picks = _heldout_picks(job, plan, offsets, digests, reasons)
    for pick in picks.values():
        reasons[pick] = KEEP_HELDOUT
    for i, task in enumerate(plan.tasks):
        _put_array(store, _decisions_key(key, task), reasons[offsets[i]:offsets[i + 1]])
    task_of = np.searchsorted(offsets, np.array(list(picks.values()), np.int64), side="right") - 1
    counts = Counter(REASONS[int(r)] for r in reasons if int(r) in REASONS)
    receipt = DedupReceipt(
        documents=n, exact_pairs=len(exact), near_pairs=len(near_pairs),
        removed=dict(sorted(counts.items())),
        heldout_picks={s: plan.tasks[t].name for s, t in zip(picks, task_of, strict=True)})
    write_receipt(store, receipt_key, receipt)
    return receipt


def _heldout_picks(job, plan, offsets, digests, reasons) -> dict[str, int]:
    """Per source, the document it must hold out because its hash drew none (data/dedup.py)."""
    fraction = job.data.heldout_fraction
    if fraction <= 0:
        return {}
    # heldout_by_hash, vectorised: the digest's first 8 bytes, big-endian, over 2^64
    hashed = digests[:, :8].copy().view(">u8").ravel() / 2.0**64 < fraction
    kept = np.isin(reasons, (KEEP, KEEP_HELDOUT))
    picks = {}
    for source in job.data.sources:
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1])
                               for i, t in enumerate(plan.tasks) if t.source == source.name])
        pick = heldout_pick(digests[rows], kept[rows], hashed[rows])
        if pick is not None:
            picks[source.name] = int(rows[pick])
    return picks


# --- stage 4: the clean parts --------------------------------------------------------------

def filter_task(job: JobSpec, store: ObjectStore, plan: CleanPlan, task: CleanTask) -> FinalReceipt:
    """The task's documents the clusters kept, with their split, as a clean part."""
    import pyarrow as pa

    key = mix_key(job)
    receipt_key = f"{_task_prefix(key, task)}/final.json"
    done = read_receipt(store, receipt_key, FinalReceipt)
    if done is not None:
        return done
    decisions = _get_array(store, _decisions_key(key, task))
    if decisions is None:
        raise DataError(f"mix {key}: the dedup clusters are not decided yet; run that stage first")
    table = _get_table(store, f"{_task_prefix(key, task)}/docs.parquet")
    ids, texts = table.column("doc_id").to_pylist(), table.column("text").to_pylist()
    digests = table.column("digest").to_pylist()
    fraction = job.data.heldout_fraction
    kept, dropped, examples = [], Counter(), {}
    for i, reason in enumerate(decisions.tolist()):
        if reason in REASONS:
            dropped[REASONS[reason]] += 1
            examples.setdefault(REASONS[reason], ids[i])
        else:
            heldout = reason == KEEP_HELDOUT or heldout_by_hash(digests[i], fraction)
            kept.append((ids[i], texts[i], "heldout" if heldout else "train"))
    out = pa.table({
        "doc_id": pa.array([k[0] for k in kept], pa.string()),
        "text": pa.array([k[1] for k in kept], pa.large_string()),
        "split": pa.array([k[2] for k in kept], pa.string()).dictionary_encode(),
    })
    _put_parquet(store, part_key(key, task), out)
    counts = DocumentCounts(read=0, kept=len(kept), heldout=sum(k[2] == "heldout" for k in kept),
                            chars_kept=sum(len(k[1]) for k in kept),
                            dropped=dict(sorted(dropped.items())))
    receipt = FinalReceipt(key=part_key(key, task), counts=counts, examples=examples)
    write_receipt(store, receipt_key, receipt)
    return receipt


# --- stage 5: the clean receipt --------------------------------------------------------

def finish_clean(job: JobSpec, store: ObjectStore, plan: CleanPlan) -> CleanReceipt:
    """Per-source counts from every task's receipts; written last (the stage is done), then
    the intermediates are removed."""
    key = mix_key(job)
    done = read_receipt(store, clean_receipt_key(key), CleanReceipt)
    if done is not None:
        return done
    receipts = task_receipts(job, store, plan)
    counts, examples, parts, fingerprints = {}, {}, {}, {}
    for source in job.data.sources:
        mine = [(t, r) for t, r in zip(plan.tasks, receipts, strict=True) if t.source == source.name]
        finals = []
        for task, _ in mine:
            final = read_receipt(store, f"{_task_prefix(key, task)}/final.json", FinalReceipt)
            if final is None:
                raise DataError(f"clean part {task.name} of mix {key} is not written; run it first")
            finals.append(final)
        dropped, ex = Counter(), {}
        for (_, r), f in zip(mine, finals, strict=True):
            dropped.update(r.dropped)
            dropped.update(f.counts.dropped)
            for reason, doc in {**r.examples, **f.examples}.items():
                ex.setdefault(reason, doc)
        c = DocumentCounts(read=sum(r.read for _, r in mine), kept=sum(f.counts.kept for f in finals),
                           heldout=sum(f.counts.heldout for f in finals),
                           chars_kept=sum(f.counts.chars_kept for f in finals),
                           dropped=dict(sorted(dropped.items())))
        if not c.kept:
            _no_documents(source, c.read, dropped, ex)
        counts[source.name], examples[source.name] = c, ex
        parts[source.name] = [f.key for f in finals]
        fingerprints[source.name] = fingerprint(list_source_files(source, store))
    receipt = CleanReceipt(mix_key=key, sources=counts, fingerprints=fingerprints,
                           examples=examples, parts=parts, tasks=len(plan.tasks))
    write_receipt(store, clean_receipt_key(key), receipt)
    for prefix in ("tasks/", "dedup/"):
        store.delete_prefix(f"{_clean_prefix(key)}/{prefix}")
    return receipt


def _require_documents(source, receipts: list[TaskReceipt]) -> None:
    if sum(r.kept for r in receipts):
        return
    dropped, examples = Counter(), {}
    for r in receipts:
        dropped.update(r.dropped)
        for reason, doc in r.examples.items():
            examples.setdefault(reason, doc)
    _no_documents(source, sum(r.read for r in receipts), dropped, examples)


def _no_documents(source, read: int, dropped: Counter, examples: dict[str, str]):
    reasons = ", ".join(f"{r}={n} (e.g. {examples[r]})" for r, n in sorted(dropped.items()))
    raise DataError(f"source {source.name!r} ({source.uri}) has no usable documents: read "
                    f"{read}, dropped {reasons or 'none'}")


# --- store helpers -------------------------------------------------------------------------

def _put_array(store: ObjectStore, key: str, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    store.put_bytes(buf.getvalue(), key)


def _get_array(store: ObjectStore, key: str) -> np.ndarray | None:
    try:
        return np.load(io.BytesIO(store.get_bytes(key)), allow_pickle=False)
    except ObjectNotFound:
        return None


def _put_table(store: ObjectStore, key: str, columns: dict[str, list]) -> None:
    import pyarrow as pa

    _put_parquet(store, key, pa.table({
        "doc_id": pa.array(columns["doc_id"], pa.string()),
        "text": pa.array(columns["text"], pa.large_string()),
        "digest": pa.array(columns["digest"], pa.binary(16)),
    }))


def _put_parquet(store: ObjectStore, key: str, table) -> None:
    import pyarrow.parquet as pq

    from fm_pipeline.data.corpus import ROWS_PER_GROUP

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=ROWS_PER_GROUP)
    store.put_bytes(buf.getvalue(), key)


def _get_table(store: ObjectStore, key: str, columns: list[str] | None = None):
    import pyarrow.parquet as pq

    local = store.local_path(key)
    if local is not None and local.is_file():
        return pq.read_table(local, columns=columns)
    try:
        return pq.read_table(io.BytesIO(store.get_bytes(key)), columns=columns)
    except ObjectNotFound:
        raise DataError(f"{store.uri_of(key)} is missing; re-run the cleaning task") from None


def _digests(store: ObjectStore, key: str, task: CleanTask) -> np.ndarray:
    column = _get_table(store, f"{_task_prefix(key, task)}/docs.parquet", ["digest"]).column(0)
    raw = b"".join(chunk.buffers()[1].to_pybytes()[chunk.offset * 16:(chunk.offset + len(chunk)) * 16]
                   for chunk in column.chunks)
    return np.frombuffer(raw, np.uint8).reshape(-1, 16)
