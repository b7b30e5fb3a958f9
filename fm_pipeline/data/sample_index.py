"""The global sample index: sample i -> (source, window), the same for every world size.

A window is `seq_len + 1` consecutive tokens of one source's train stream (windows do not
overlap). The index is built once, pre-shuffled, and stored with the mix, so rank r of any
data-parallel layout reads the same global samples: the loader only decides which slice of
the sequence each rank takes.

Size: the largest mix that honours the weights without repeating any window, i.e.
N = min over sources of (windows_s / weight_s); source s contributes round(weight_s * N)
windows, drawn at random. Past N the sequence keeps going: pass p > 0 revisits the same N
samples in an order given by a seeded affine permutation (cheap, no extra storage).
"""

from __future__ import annotations

import math

import numpy as np

from fm_pipeline.data.errors import DataError

SOURCE_SHIFT = 40  # window ids below 2**40 (1.1e12 windows per source); up to 2**23 sources
WINDOW_MASK = (1 << SOURCE_SHIFT) - 1


def samples_per_source(windows: dict[str, int], weights: dict[str, float]) -> dict[str, int]:
    """How many index entries each source gets; raises DataError for a source with no window."""
    empty = [name for name, n in windows.items() if n == 0]
    if empty:
        raise DataError(
            f"source(s) {', '.join(empty)} have fewer train tokens than one sample window "
            "(seq_len + 1); add documents or lower training.seq_len"
        )
    total = min(windows[s] / weights[s] for s in windows)
    return {s: min(windows[s], max(1, round(weights[s] * total))) for s in windows}


def build_sample_index(counts: dict[str, int], windows: dict[str, int], *, seed: int) -> np.ndarray:
    """int64 entries `source_id << SOURCE_SHIFT | window`, globally shuffled.

    `counts` and `windows` are keyed by source name in mix order (source_id = position).
    """
    parts = []
    for source_id, (name, count) in enumerate(counts.items()):
        rng = np.random.default_rng([seed, source_id])
        chosen = rng.permutation(windows[name])[:count].astype(np.int64)
        parts.append(chosen | (np.int64(source_id) << SOURCE_SHIFT))
    entries = np.concatenate(parts)
    return entries[np.random.default_rng([seed, 1 << 20]).permutation(len(entries))]


def split_entries(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source_ids, windows) of index entries."""
    return entries >> SOURCE_SHIFT, entries & WINDOW_MASK


def pass_positions(positions: np.ndarray, n: int, *, seed: int) -> np.ndarray:
    """Map global sample numbers to index positions; pass p > 0 uses a seeded permutation."""
    passes, offsets = np.divmod(positions, n)
    out = offsets.copy()
    for p in np.unique(passes):
        if p == 0:
            continue
        a, b = _affine(int(p), n, seed)
        sel = passes == p
        # (a * j + b) mod n is a bijection on [0, n) when gcd(a, n) == 1; use Python ints
        # for the product so that large n cannot overflow int64.
        out[sel] = [(a * int(j) + b) % n for j in offsets[sel]]
    return out


def _affine(p: int, n: int, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng([seed, p])
    a = int(rng.integers(1, max(2, n)))
    while math.gcd(a, n) != 1:
        a = a % n + 1
    return a, int(rng.integers(0, n))
