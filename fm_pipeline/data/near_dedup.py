"""Near-duplicate removal: MinHash signatures over word n-grams, LSH bands, and a check of
each candidate's estimated Jaccard similarity against a threshold.

    index = NearDuplicates(NearDedupSpec(ngram=5, bands=32, rows=4, threshold=0.7))
    index.is_duplicate(text)    # True: a kept document is this similar; else it is kept

A document's shingles are its lower-cased word n-grams, each hashed to 64 bits (BLAKE2b).
Its signature is, for each of bands x rows hash functions h(x) = (a x + b) mod 2^64 >> 32
(multiply-shift, a odd), the minimum over its shingles. Two documents of Jaccard
similarity s agree on one signature entry with probability s, so they share at least one
band of `rows` entries (and become candidates) with probability 1 - (1 - s^rows)^bands;
a candidate counts as a duplicate when the share of equal entries, an unbiased estimate of
s, reaches `threshold`. The first document of a cluster is kept (sources in the spec's
order, files in sorted order): deterministic.

This runs inside the cleaning pass of one process (its memory: a signature per kept
document); the file-based stages that spread it over tasks are not built yet.
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


class NearDuplicates:
    """An LSH index of the documents kept so far."""

    def __init__(self, spec):
        self.spec = spec
        self.hasher = MinHasher(spec.bands * spec.rows, spec.seed)
        self.buckets: list[dict[bytes, int]] = [{} for _ in range(spec.bands)]
        self.signatures: list[np.ndarray] = []

    def is_duplicate(self, text: str) -> bool:
        """Whether a kept document is near `text`; if not, `text` is kept (indexed)."""
        sig = self.hasher.signature(shingles(text, self.spec.ngram))
        bands = sig.reshape(self.spec.bands, self.spec.rows)
        keys = [band.tobytes() for band in bands]
        seen = set()
        for bucket, key in zip(self.buckets, keys, strict=True):
            doc = bucket.get(key)
            if doc is None or doc in seen:
                continue
            seen.add(doc)
            if float(np.mean(self.signatures[doc] == sig)) >= self.spec.threshold:
                return True
        doc = len(self.signatures)
        self.signatures.append(sig)
        for bucket, key in zip(self.buckets, keys, strict=True):
            bucket.setdefault(key, doc)
        return False


def candidate_probability(similarity: float, *, bands: int, rows: int) -> float:
    """The LSH S-curve: P(two documents of this Jaccard similarity share a band)."""
    return 1 - (1 - similarity ** rows) ** bands
