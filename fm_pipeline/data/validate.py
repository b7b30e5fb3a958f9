"""Data-quality checks on each stage's output, run as Great Expectations suites.

Every check builds a small table of facts measured from the store (per shard, per source),
validates it with GX expectations, and returns a CheckOutcome; the Dagster layer turns
them into blocking asset checks and `fm data prepare` prints them.

    dedup_ratio                    clean corpus: duplicates/read per source (warns above 0.5)
    filter_drop_rates              clean corpus: near-duplicates/read (<= 0.5) and documents
                                   dropped by the quality filters/read (<= 0.9) per source
    tokenizer_fits_model_vocab     tokenizer ids < the model's vocab_size
    token_ids_below_vocab          every token id in every shard < vocab_size
    no_empty_shards                every shard holds tokens, and every source has shards
    shards_within_token_limit      no shard holds more tokens than the shard capacity
    weights_sum_to_one             spec weights sum to 1; the index draws each source at its weight
    source_counts_match_manifest   index entries, shard tokens, shard checksums and kept documents
                                   re-counted from the store equal the manifest's numbers
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fm_pipeline.data.corpus import CleanReceipt, ShardsReceipt, clean_parts
from fm_pipeline.data.errors import CorruptShardError, DataError
from fm_pipeline.data.manifest import MixManifest, TokenizerEntry
from fm_pipeline.data.sample_index import split_entries
from fm_pipeline.data.shards import decode_shard, verify_shard_bytes
from fm_pipeline.storage import ObjectNotFound, ObjectStore

MAX_DEDUP_RATIO = 0.5
MAX_QUALITY_DROP_RATE = 0.9  # a filter set that drops more is misconfigured for the source
# Per-source share bands the warnings use unless the job spec's data.checks sets them.
DEFAULT_BANDS = {"dedup_ratio": (0.0, MAX_DEDUP_RATIO), "near_dedup_ratio": (0.0, MAX_DEDUP_RATIO),
                 "quality_drop_rate": (0.0, MAX_QUALITY_DROP_RATE)}
QUALITY_PREFIXES = ("gopher_", "c4_")


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    description: str
    severity: str = "error"  # "error" blocks downstream work; "warn" only reports
    metadata: dict[str, Any] = field(default_factory=dict)


def band(checks, source: str, name: str) -> tuple[float, float]:
    """The [low, high] a source's `name` share must lie in: its own override, else the
    mix-wide band of the job spec's data.checks, else the defaults."""
    own = getattr(checks.sources.get(source), name, None) if checks is not None else None
    mix = getattr(checks, name, None) if checks is not None else None
    low, high = own or mix or DEFAULT_BANDS[name]
    return float(low), float(high)


def _in_bands(rows: list[dict], names: Sequence[str], checks):
    """Great Expectations over the per-source shares: a column per share saying whether it is
    outside that source's band (the band may differ per source), expected all 0."""
    import pandas as pd

    table = pd.DataFrame(rows)
    outside = []
    for name in names:
        bands = [band(checks, r["source"], name) for r in rows]
        table[f"{name}_outside_band"] = [
            int(not lo <= r[name] <= hi) for r, (lo, hi) in zip(rows, bands, strict=True)]
        outside += [f"{r['source']} {name} {r[name]:.4f} outside [{lo:g}, {hi:g}]"
                    for r, (lo, hi) in zip(rows, bands, strict=True) if not lo <= r[name] <= hi]
    gxe = _gxe()
    ok, facts = _validate(table, *(
        gxe.ExpectColumnValuesToBeBetween(column=f"{n}_outside_band", min_value=0, max_value=0)
        for n in names))
    return ok, facts, outside


def check_clean_corpus(receipt: CleanReceipt, checks=None) -> list[CheckOutcome]:
    """`checks`: the job spec's data.checks (bands per share and source); None: defaults."""
    rows = [{"source": name, "read": c.read, "kept": c.kept,
             "dedup_ratio": receipt.dedup_ratio(name)} for name, c in receipt.sources.items()]
    ok, facts, outside = _in_bands(rows, ["dedup_ratio"], checks)
    ratios = {r["source"]: round(r["dedup_ratio"], 4) for r in rows}
    return [CheckOutcome(
        "dedup_ratio", ok,
        f"exact duplicates dropped / documents read: {ratios} (mix {receipt.dedup_ratio():.4f})"
        + (f"; {'; '.join(outside)}" if outside else "")
        + f"; above {band(checks, '', 'dedup_ratio')[1]:g} suggests a source listed twice",
        severity="warn", metadata={"dedup_ratio": round(receipt.dedup_ratio(), 6), **facts},
    ), _check_filter_rates(receipt, checks)]


def _check_filter_rates(receipt: CleanReceipt, checks=None) -> CheckOutcome:
    def share(c, keep) -> float:
        return sum(n for r, n in c.dropped.items() if keep(r)) / c.read if c.read else 0.0

    rows = [{"source": name,
             "near_dedup_ratio": share(c, lambda r: r == "near_duplicate"),
             "quality_drop_rate": share(c, lambda r: r.startswith(QUALITY_PREFIXES))}
            for name, c in receipt.sources.items()]
    ok, facts, outside = _in_bands(rows, ["near_dedup_ratio", "quality_drop_rate"], checks)
    rates = {r["source"]: (round(r["near_dedup_ratio"], 4), round(r["quality_drop_rate"], 4))
             for r in rows}
    return CheckOutcome(
        "filter_drop_rates", ok,
        f"(near-duplicates, quality-filtered) / documents read per source: {rates}"
        + (f"; {'; '.join(outside)}" if outside else "")
        + "; outside the band suggests parameters wrong for the source", severity="warn",
        metadata=facts)


def check_tokenizer(entry: TokenizerEntry, *, vocab_size: int) -> list[CheckOutcome]:
    ok = entry.vocab_size <= vocab_size and 0 <= entry.eos_id < vocab_size
    return [CheckOutcome(
        "tokenizer_fits_model_vocab", ok,
        f"tokenizer vocab {entry.vocab_size} (eos {entry.eos_id}) within model vocab_size {vocab_size}",
        metadata={"tokenizer_vocab": entry.vocab_size, "model_vocab": vocab_size},
    )]


def check_token_shards(store: ObjectStore, receipt: ShardsReceipt, *, vocab_size: int,
                       sources: Sequence[str]) -> list[CheckOutcome]:
    """Token ids, empty shards and the token limit, on the shards as read back."""
    import pandas as pd

    rows = []
    for source in sources:
        for entry in receipt.shards.get(source, []):
            tokens = _read_tokens(store, entry, receipt.dtype)
            rows.append({"source": source, "key": entry.key, "tokens": len(tokens),
                         "max_id": int(tokens.max()) if len(tokens) else -1,
                         "min_id": int(tokens.min()) if len(tokens) else 0})
    table = pd.DataFrame(rows, columns=["source", "key", "tokens", "max_id", "min_id"])
    gxe = _gxe()
    ids_ok, ids_facts = _validate(
        table,
        gxe.ExpectColumnMaxToBeBetween(column="max_id", max_value=vocab_size - 1),
        gxe.ExpectColumnMinToBeBetween(column="min_id", min_value=0),
    )
    bad_ids = table[table.max_id >= vocab_size].key.tolist()
    empty_ok, empty_facts = _validate(table, gxe.ExpectColumnValuesToBeBetween(column="tokens", min_value=1))
    missing = [s for s in sources if s not in set(table.source)]
    empty = table[table.tokens < 1].key.tolist()
    return [
        CheckOutcome(
            "token_ids_below_vocab", ids_ok and not table.empty,
            f"max token id {int(table.max_id.max()) if len(table) else None} < vocab_size "
            f"{vocab_size}" + (f"; out of range in {bad_ids[:5]}" if bad_ids else ""),
            metadata={"max_token_id": int(table.max_id.max()) if len(table) else -1,
                      "vocab_size": vocab_size, **ids_facts},
        ),
        CheckOutcome(
            "no_empty_shards", empty_ok and not missing and not table.empty,
            f"{len(table)} shards, {len(empty)} empty"
            + (f" ({empty[:5]})" if empty else "") + (f"; sources without shards: {missing}" if missing else ""),
            metadata={"shards": len(table), "empty_shards": len(empty), **empty_facts},
        ),
        _check_token_limit(table, receipt.capacity),
    ]


def _check_token_limit(table, capacity: int) -> CheckOutcome:
    """A shard above the capacity (data.shard_tokens in whole sample windows) breaks the
    memory bound of the readers that map one shard at a time."""
    ok, facts = _validate(table, _gxe().ExpectColumnValuesToBeBetween(
        column="tokens", min_value=0, max_value=capacity))
    over = table[table.tokens > capacity]
    return CheckOutcome(
        "shards_within_token_limit", ok and not table.empty,
        f"largest shard {int(table.tokens.max()) if len(table) else 0} tokens, limit {capacity}"
        + (f"; over it: {[f'{k} ({t})' for k, t in zip(over.key, over.tokens)][:5]}"
           if len(over) else ""),
        metadata={"capacity": capacity, "over_limit": len(over), **facts})


def check_data_mix(store: ObjectStore, manifest: MixManifest) -> list[CheckOutcome]:
    import pandas as pd

    gxe = _gxe()
    drawn, samples, corrupt = _read_index(store, manifest)
    rows = []
    for i, s in enumerate(manifest.sources):
        shard_tokens = 0
        for entry in s.shards:
            try:
                shard_tokens += len(_read_tokens(store, entry, manifest.dtype, verify=True))
            except CorruptShardError as e:
                corrupt.append(str(e))
        rows.append({
            "source": s.name, "weight": s.weight, "fraction": drawn[i] / max(1, samples),
            "manifest_samples": s.samples, "index_samples": int(drawn[i]),
            "manifest_tokens": s.train_tokens + s.heldout_tokens, "shard_tokens": shard_tokens,
            "manifest_docs": s.documents.kept, "corpus_docs": _parquet_rows(store, manifest.key, s.name),
        })
    table = pd.DataFrame(rows)
    tolerance = max(0.01, 2.0 / max(1, samples))
    table["weight_error"] = (table.fraction - table.weight).abs()
    weights_ok, weights_facts = _validate(
        table,
        gxe.ExpectColumnSumToBeBetween(column="weight", min_value=1 - 1e-6, max_value=1 + 1e-6),
        gxe.ExpectColumnValuesToBeBetween(column="weight_error", max_value=tolerance),
    )
    counts_ok, counts_facts = _validate(
        table,
        gxe.ExpectColumnPairValuesToBeEqual(column_A="manifest_samples", column_B="index_samples"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="manifest_tokens", column_B="shard_tokens"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="manifest_docs", column_B="corpus_docs"),
    )
    per_source = table.set_index("source")
    return [
        CheckOutcome(
            "weights_sum_to_one", weights_ok,
            f"weights sum to {table.weight.sum():.6g}; drawn fractions "
            f"{ {k: round(float(v), 4) for k, v in per_source.fraction.items()} } vs weights "
            f"{ {k: float(v) for k, v in per_source.weight.items()} } (tolerance {tolerance:.3g})",
            metadata={"weight_sum": float(table.weight.sum()), **weights_facts},
        ),
        CheckOutcome(
            "source_counts_match_manifest",
            counts_ok and not corrupt and samples == manifest.sample_index.samples,
            "index entries, shard tokens and documents per source equal the manifest"
            + (f"; {len(corrupt)} corrupt file(s): {corrupt[:3]}" if corrupt else ""),
            metadata={"samples": samples, "corrupt": len(corrupt), **counts_facts},
        ),
    ]


# --- helpers ---------------------------------------------------------------------------

def _gxe():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations.expectations as gxe

    return gxe


def _validate(table, *expectations) -> tuple[bool, dict[str, Any]]:
    """Run GX expectations on a pandas table; (all passed, observed facts per expectation)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    ctx = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        progress_bars=ProgressBarsConfig(globally=False),
    ))
    batch = (ctx.data_sources.add_pandas("fm").add_dataframe_asset("table")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": table}))
    suite = gx.ExpectationSuite(name="fm-data", expectations=list(expectations))
    result = batch.validate(suite)
    facts = {}
    for r in result.results:
        kw = r.expectation_config.kwargs
        cols = kw.get("column") or f"{kw.get('column_A')}={kw.get('column_B')}"
        name = f"{r.expectation_config.type}({cols})"
        observed = r.result.get("observed_value", r.result.get("unexpected_count"))
        facts[name] = f"{'ok' if r.success else 'FAILED'} (observed {_plain(observed)})"
    return bool(result.success), facts


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _read_tokens(store: ObjectStore, entry, dtype: str, *, verify: bool = False) -> np.ndarray:
    try:
        data = store.get_bytes(entry.key)
    except ObjectNotFound:
        raise CorruptShardError(entry.key, "missing from the store") from None
    if verify:
        verify_shard_bytes(entry, data)
    return decode_shard(data, dtype)


def _read_index(store: ObjectStore, manifest: MixManifest) -> tuple[np.ndarray, int, list[str]]:
    """Entries drawn per source over every index shard, one shard in memory at a time; the
    entries read; the shards that are missing or differ from their SHA-256."""
    drawn = np.zeros(len(manifest.sources), dtype=np.int64)
    samples, corrupt = 0, []
    for part in manifest.sample_index.parts():
        try:
            data = store.get_bytes(part.key)
        except ObjectNotFound:
            corrupt.append(f"sample index {part.key}: missing")
            continue
        if hashlib.sha256(data).hexdigest() != part.sha256:
            corrupt.append(f"sample index {part.key}: sha256 differs from the manifest")
        source_ids, _ = split_entries(np.frombuffer(data, dtype="<i8"))
        drawn += np.bincount(source_ids, minlength=len(drawn))[:len(drawn)]
        samples += len(data) // 8
    return drawn, samples, corrupt


def _parquet_rows(store: ObjectStore, key: str, source: str) -> int:
    import io

    import pyarrow.parquet as pq

    try:
        return sum(pq.ParquetFile(io.BytesIO(store.get_bytes(part))).metadata.num_rows
                   for part in clean_parts(store, key, source))
    except (ObjectNotFound, DataError):
        return -1


def validate_published(store: ObjectStore, manifest: MixManifest) -> list[CheckOutcome]:
    """Every check, on a published mix (what `fm data prepare` reports)."""
    from fm_pipeline.data.corpus import read_receipt
    from fm_pipeline.data.manifest import clean_receipt_key, shards_receipt_key

    outcomes = []
    clean = read_receipt(store, clean_receipt_key(manifest.key), CleanReceipt)
    if clean is not None:
        outcomes += check_clean_corpus(clean)
    outcomes += check_tokenizer(manifest.tokenizer, vocab_size=manifest.vocab_size)
    shards = read_receipt(store, shards_receipt_key(manifest.key), ShardsReceipt)
    if shards is not None:
        outcomes += check_token_shards(store, shards, vocab_size=manifest.vocab_size,
                                       sources=[s.name for s in manifest.sources])
    return outcomes + check_data_mix(store, manifest)


# --- per stage, from a job spec (what the Dagster asset checks run) --------------------

def clean_checks(job, store: ObjectStore) -> list[CheckOutcome]:
    from fm_pipeline.data.corpus import read_receipt
    from fm_pipeline.data.manifest import clean_receipt_key, mix_key

    receipt = read_receipt(store, clean_receipt_key(mix_key(job)), CleanReceipt)
    if receipt is None:
        return [_missing(name, "clean corpus") for name in ("dedup_ratio", "filter_drop_rates")]
    return check_clean_corpus(receipt, job.data.checks)


def tokenizer_checks(job, store: ObjectStore) -> list[CheckOutcome]:
    from fm_pipeline.data.manifest import mix_key
    from fm_pipeline.data.shard_stages import tokenizer_entry as _tokenizer_entry

    try:
        entry = _tokenizer_entry(store, mix_key(job))
    except ObjectNotFound:
        return [_missing("tokenizer_fits_model_vocab", "tokenizer")]
    return check_tokenizer(entry, vocab_size=job.model_cfg.vocab_size)


def shard_checks(job, store: ObjectStore) -> list[CheckOutcome]:
    from fm_pipeline.data.corpus import read_receipt
    from fm_pipeline.data.manifest import mix_key, shards_receipt_key

    receipt = read_receipt(store, shards_receipt_key(mix_key(job)), ShardsReceipt)
    if receipt is None:
        return [_missing(name, "shards") for name in
                ("token_ids_below_vocab", "no_empty_shards", "shards_within_token_limit")]
    return check_token_shards(store, receipt, vocab_size=job.model_cfg.vocab_size,
                              sources=[s.name for s in job.data.sources])


def mix_checks(job, store: ObjectStore) -> list[CheckOutcome]:
    from fm_pipeline.data.manifest import mix_key
    from fm_pipeline.data.mix import open_mix

    try:
        manifest = open_mix(store, mix_key(job)).manifest
    except DataError as e:
        return [CheckOutcome(n, False, str(e)) for n in ("weights_sum_to_one", "source_counts_match_manifest")]
    return check_data_mix(store, manifest)


def _missing(name: str, what: str) -> CheckOutcome:
    return CheckOutcome(name, False, f"no {what} in the store: the stage has not finished")
