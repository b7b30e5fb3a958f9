"""Near-duplicate removal against planted near-duplicates of known Jaccard similarity:
recall >= 0.95 at similarity >= 0.8, no removal below 0.5, deterministic, and the mix key
of a spec without it unchanged."""

from __future__ import annotations

import random

import pytest

from fm_pipeline.config.spec import NearDedupSpec
from fm_pipeline.data.clean import Cleaner
from fm_pipeline.data.near_dedup import NearDuplicates, candidate_probability, jaccard, shingles
from fm_pipeline.data.sources import RawDocument

SPEC = NearDedupSpec()
VOCAB = [f"w{i}" for i in range(5000)]


def variant(words: list[str], rng: random.Random, edits: float) -> list[str]:
    """Substitutions, insertions and a moved paragraph: the edits a mirror or template makes."""
    out = list(words)
    for _ in range(int(edits * len(out))):
        i = rng.randrange(len(out))
        if rng.random() < 0.7:
            out[i] = rng.choice(VOCAB)
        else:
            out.insert(i, rng.choice(VOCAB))
    cut = rng.randrange(len(out) // 2)
    return out[cut:cut + 40] + out[:cut] + out[cut + 40:] if rng.random() < 0.3 else out


@pytest.fixture(scope="module")
def planted():
    """300 originals, each followed by one variant; the pairs' true Jaccard similarities."""
    rng = random.Random(7)
    docs, pairs = [], []
    for _ in range(300):
        base = [rng.choice(VOCAB) for _ in range(rng.randrange(150, 400))]
        near = variant(base, rng, edits=rng.choice([0.005, 0.01, 0.02, 0.04, 0.08, 0.15]))
        similarity = jaccard(shingles(" ".join(base), SPEC.ngram),
                             shingles(" ".join(near), SPEC.ngram))
        pairs.append((len(docs), len(docs) + 1, similarity))
        docs += [" ".join(base), " ".join(near)]
    return docs, pairs


def test_planted_near_duplicates_are_found_and_dissimilar_ones_kept(planted):
    docs, pairs = planted
    index = NearDuplicates(SPEC)
    dropped = {i for i, text in enumerate(docs) if index.is_duplicate(text)}
    high = [p for p in pairs if p[2] >= 0.8]
    low = [p for p in pairs if p[2] < 0.5]
    assert len(high) > 50 and len(low) > 50  # the corpus spans both sides
    recall = sum(b in dropped for _, b, _ in high) / len(high)
    assert recall >= 0.95, recall
    assert not [p for p in low if p[1] in dropped]  # no false removal below 0.5
    assert not {a for a, _, _ in pairs} & dropped  # the first of a cluster is kept
    again = NearDuplicates(SPEC)
    assert {i for i, text in enumerate(docs) if again.is_duplicate(text)} == dropped


def test_the_s_curve_makes_candidates_of_similar_pairs():
    assert candidate_probability(0.8, bands=SPEC.bands, rows=SPEC.rows) > 0.999
    assert candidate_probability(0.3, bands=SPEC.bands, rows=SPEC.rows) < 0.25


def test_the_cleaner_counts_near_duplicates_as_their_own_drop_reason(planted):
    docs, _ = planted
    cleaner = Cleaner(min_chars=1, max_chars=10**6, heldout_fraction=0.0, near_dedup=SPEC)
    out = cleaner.clean_source("web", (RawDocument(f"web:{i}", d) for i, d in enumerate(docs)))
    assert out.dropped["near_duplicate"] > 100 and out.examples["near_duplicate"].startswith("web:")
    plain = Cleaner(min_chars=1, max_chars=10**6, heldout_fraction=0.0)
    assert "near_duplicate" not in plain.clean_source(
        "web", (RawDocument(f"web:{i}", d) for i, d in enumerate(docs))).dropped


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

    later = ("near_dedup", "quality", "mask_pii", "checks")  # added after mixes were published
    old = {"format": MIX_FORMAT, "data": {k: v for k, v in job.data.model_dump(mode="json")
                                           .items() if k not in later},
           "vocab_size": job.model_cfg.vocab_size, "seq_len": job.training.seq_len}
    blob = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    assert mix_key(job) == hashlib.sha256(blob).hexdigest()[:16]
