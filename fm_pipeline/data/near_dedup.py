"""Near-duplicate detection: MinHash signatures over word n-grams, LSH band keys, the
candidate pairs that share a band, and each candidate's estimated Jaccard similarity.

    sig = MinHasher(bands * rows, seed).signature(shingles(text, ngram))
    keys = band_keys(signatures, rows=rows, bands=range(bands))    # per document and band
    pairs = candidate_pairs(keys, ids)                               # share >= 1 band
    similar = pairs[agreement(sig[pairs[:, 0]], sig[pairs[:, 1]]) >= threshold]

A document's shingles are its lower-cased word n-grams, each hashed to 64 bits (BLAKE2b).
Its signature is, for each of bands x rows hash functions h(x) = (a x + b) mod 2^64 >> 32
(multiply-shift, a odd), the minimum over its shingles. Two documents of Jaccard
similarity s agree on one signature entry with probability s, so they share at least one
band of `rows` entries (and become candidates) with probability 1 - (1 - s^rows)^bands;
a candidate counts as similar when the share of equal entries, an unbiased estimate of
s, reaches `threshold`. Clusters and which document of each is kept: data/dedup.py; the
file-based stages that run this over tasks: data/clean_stages.py.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

_WORD = re.compile(r"\w+")
_SHIFT = np.uint64(32)


def shingles(text: str, ngram: int) -> set[str]:
    words = _WORD.findall(text.lower())
    if len(words) < ngram:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + ngram]) for i in range(len(words) - ngram + 1)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class MinHasher:
    def __init__(self, num_perm: int, seed: int):
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | np.uint64(1)
        self.b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)

    def signature(self, shingle_set: set[str]) -> np.ndarray:
        if not shingle_set:
            return np.full(len(self.a), np.iinfo(np.uint32).max, dtype=np.uint32)
        hashes = np.fromiter(
            (int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")
             for s in shingle_set), dtype=np.uint64, count=len(shingle_set))
        out = np.full(len(self.a), np.iinfo(np.uint64).max, dtype=np.uint64)
        for start in range(0, len(hashes), 4096):  # bounded memory for long documents
            chunk = hashes[start:start + 4096, None]
            np.minimum(out, ((chunk * self.a + self.b) >> _SHIFT).min(axis=0), out=out)
        return out.astype(np.uint32)


def band_keys(signatures: np.ndarray, *, rows: int, bands: range) -> np.ndarray:
    """One 64-bit key per document and band (FNV-1a over the band's `rows` entries): two
    documents share a key when they agree on the whole band (a 2^-64 chance otherwise,
    which the verification of each candidate absorbs)."""
    keys = np.full((len(signatures), len(bands)), np.uint64(0xCBF29CE484222325), np.uint64)
    prime = np.uint64(0x100000001B3)
    for j, band in enumerate(bands):
        for r in range(band * rows, (band + 1) * rows):
            keys[:, j] ^= signatures[:, r].astype(np.uint64)
            keys[:, j] *= prime
    return keys


def first_of_run_pairs(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """(first, other) for every document whose key row equals an earlier one's: each is
    paired with the lowest id holding that key (a bucket joined to its first member)."""
    n = len(ids)
    if n < 2:
        return np.empty((0, 2), np.int64)
    order = np.lexsort([ids] + [keys[:, j] for j in reversed(range(keys.shape[1]))])
    sorted_keys, sorted_ids = keys[order], ids[order]
    starts = np.ones(n, bool)
    starts[1:] = np.any(sorted_keys[1:] != sorted_keys[:-1], axis=1)
    run_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    return np.stack([sorted_ids[run_start][~starts], sorted_ids[~starts]], axis=1)


def candidate_pairs(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Pairs that share at least one band, each once, (lower id, higher id), sorted."""
    found = [first_of_run_pairs(keys[:, j:j + 1], ids) for j in range(keys.shape[1])]
    pairs = np.concatenate(found) if found else np.empty((0, 2), np.int64)
    return np.unique(pairs, axis=0) if len(pairs) else pairs


def agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of equal signature entries per row: an unbiased estimate of Jaccard."""
    return np.mean(a == b, axis=1)


def candidate_probability(similarity: float, *, bands: int, rows: int) -> float:
    """The LSH S-curve: P(two documents of this Jaccard similarity share a band)."""
    return 1 - (1 - similarity ** rows) ** bands
