"""Which documents of a mix are duplicates: clusters of exact and near-duplicate pairs,
one document kept per cluster.

Documents carry global ids in mix order (sources in the spec's order, files sorted,
documents in file order). Exact pairs join documents with the same text digest; near
pairs are LSH candidates whose estimated Jaccard similarity reached the threshold
(data/near_dedup.py). The connected components of both are the clusters; the lowest id of
each is kept, so the choice is deterministic and does not depend on how the work was split
into tasks. A removed document is a `duplicate` when an earlier document has its exact
text, else a `near_duplicate`.
"""

from __future__ import annotations

import numpy as np

from fm_pipeline.data.near_dedup import first_of_run_pairs

KEEP, DUPLICATE, NEAR_DUPLICATE, KEEP_HELDOUT = 0, 1, 2, 3
REASONS = {DUPLICATE: "duplicate", NEAR_DUPLICATE: "near_duplicate"}


def digest_columns(digests: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 2) uint64, the form exact matching sorts on."""
    return np.ascontiguousarray(digests, dtype=np.uint8).view(np.uint64).reshape(-1, 2)


def exact_pairs(digests: np.ndarray) -> np.ndarray:
    """(first, later) for every document whose 16-byte digest an earlier one has."""
    return first_of_run_pairs(digest_columns(digests), np.arange(len(digests), dtype=np.int64))


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Label per document: the lowest id of its connected component (min-label
    propagation with pointer jumping; rounds grow with the clusters' diameter, not n)."""
    labels = np.arange(n, dtype=np.int64)
    if not len(pairs):
        return labels
    a, b = pairs[:, 0], pairs[:, 1]
    while True:
        la, lb = labels[a], labels[b]
        if np.array_equal(la, lb):
            return labels
        low = np.minimum(la, lb)
        np.minimum.at(labels, la, low)
        np.minimum.at(labels, lb, low)
        while True:
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped


def decide(n: int, exact: np.ndarray, near: np.ndarray) -> np.ndarray:
    """KEEP, DUPLICATE or NEAR_DUPLICATE per document (uint8)."""
    pairs = np.concatenate([exact, near]) if len(near) else exact
    labels = components(n, pairs)
    reasons = np.where(labels != np.arange(n), NEAR_DUPLICATE, KEEP).astype(np.uint8)
    reasons[exact[:, 1]] = DUPLICATE
    return reasons


def heldout_pick(digests: np.ndarray, kept: np.ndarray, hashed_heldout: np.ndarray) -> int | None:
    """The one document a source must hold out when its hash drew none (so that every domain
    can be evaluated): the kept one with the smallest digest; None when not needed (< 2
    documents kept, or some already held out)."""
    if kept.sum() < 2 or (hashed_heldout & kept).any():
        return None
    ids = np.flatnonzero(kept)
    ranked = np.lexsort(digest_columns(digests[ids]).byteswap().T[::-1])  # big-endian order
    return int(ids[ranked[0]])
