"""Near-duplicate removal against planted near-duplicates of known Jaccard similarity:
recall >= 0.95 at similarity >= 0.8, no removal below 0.5, deterministic, and the mix key
of a spec without it unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from fm_pipeline.config.spec import NearDedupSpec
from fm_pipeline.data.clean import text_digest
from fm_pipeline.data.dedup import (
    DUPLICATE,
    KEEP,
    NEAR_DUPLICATE,
    components,
    decide,
    exact_pairs,
)
from fm_pipeline.data.near_dedup import (
    MinHasher,
    agreement,
    band_keys,
    candidate_pairs,
    candidate_probability,
    shingles,
)
from fm_pipeline.data.planted import planted_near_duplicates

SPEC = NearDedupSpec()


@pytest.fixture(scope="module")
def planted():
    """300 originals, each followed by one variant; the pairs' true Jaccard similarities."""
    return planted_near_duplicates(300, seed=7, ngram=SPEC.ngram)


def removed_ids(docs: list[str], spec=SPEC) -> set[int]:
    """Which documents the dedup decides to remove, on in-memory arrays (the stages' math)."""
    hasher = MinHasher(spec.bands * spec.rows, spec.seed)
    sigs = np.stack([hasher.signature(shingles(d, spec.ngram)) for d in docs])
    ids = np.arange(len(docs), dtype=np.int64)
    pairs = candidate_pairs(band_keys(sigs, rows=spec.rows, bands=range(spec.bands)), ids)
    near = pairs[agreement(sigs[pairs[:, 0]], sigs[pairs[:, 1]]) >= spec.threshold]
    digests = np.frombuffer(b"".join(text_digest(d) for d in docs), np.uint8).reshape(-1, 16)
    return set(np.flatnonzero(decide(len(docs), exact_pairs(digests), near)).tolist())


def test_planted_near_duplicates_are_found_and_dissimilar_ones_kept(planted):
    docs, pairs = planted
    dropped = removed_ids(docs)
    high = [p for p in pairs if p[2] >= 0.8]
    low = [p for p in pairs if p[2] < 0.5]
    assert len(high) > 50 and len(low) > 50  # the corpus spans both sides
    recall = sum(b in dropped for _, b, _ in high) / len(high)
    assert recall >= 0.95, recall
    assert not [p for p in low if p[1] in dropped]  # no false removal below 0.5
    assert not {a for a, _, _ in pairs} & dropped  # the first of a cluster is kept
    assert removed_ids(docs) == dropped


def test_clusters_keep_their_lowest_id_and_name_exact_copies():
    # 0~1 and 1~2 join one cluster (0 kept) even though 0 and 2 were never paired; 4 is an
    # exact copy of 3.
    digests = np.zeros((5, 16), np.uint8)
    digests[:, 0] = [1, 2, 3, 4, 4]
    reasons = decide(5, exact_pairs(digests), np.array([[0, 1], [1, 2]], np.int64))
    assert reasons.tolist() == [KEEP, NEAR_DUPLICATE, NEAR_DUPLICATE, KEEP, DUPLICATE]
    assert components(4, np.array([[2, 3], [0, 3]], np.int64)).tolist() == [0, 1, 0, 0]


def test_the_s_curve_makes_candidates_of_similar_pairs():
    assert candidate_probability(0.8, bands=SPEC.bands, rows=SPEC.rows) > 0.999
    assert candidate_probability(0.3, bands=SPEC.bands, rows=SPEC.rows) < 0.25


def test_a_spec_without_near_dedup_keeps_its_mix_key():
    from fm_pipeline.data.manifest import mix_key
    from fm_pipeline.data.testing import small_job

    job = small_job()
    assert job.data.near_dedup is None
    on = small_job(**{"data.near_dedup": {"threshold": 0.8}})
    assert mix_key(on) != mix_key(job)
    # The key of a spec without the option is the one it had before the option existed.
    import hashlib
    import json

    from fm_pipeline.data.manifest import MIX_FORMAT

    later = ("near_dedup", "quality", "mask_pii", "checks", "task_bytes", "workers")  # added after mixes were published
    later_per_source = ("symlinks",)
    data = {k: v for k, v in job.data.model_dump(mode="json").items() if k not in later}
    data["sources"] = [{k: v for k, v in s.items() if k not in later_per_source}
                       for s in data["sources"]]
    old = {"format": MIX_FORMAT, "data": data,
           "vocab_size": job.model_cfg.vocab_size, "seq_len": job.training.seq_len}
    blob = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    assert mix_key(job) == hashlib.sha256(blob).hexdigest()[:16]
