"""The global sample index: sample i -> (source, window), the same for every world size.

A window is `seq_len + 1` consecutive tokens of one source's train stream (windows do not
overlap). The index is built once, pre-shuffled, and stored with the mix, so rank r of any
data-parallel layout reads the same global samples: the loader only decides which slice of
the sequence each rank takes.

Size: the largest mix that honours the weights without repeating any window, i.e.
N = min over sources of (windows_s / weight_s); source s contributes round(weight_s * N)
windows, drawn at random. Past N the sequence keeps going: pass p > 0 revisits the same N
samples in an order given by a seeded affine permutation (cheap, no extra storage).

Stored and built in shards of at most INDEX_SHARD_SAMPLES entries, one at a time, so that
neither the publish stage nor a reader holds the whole index: shard j takes
floor(count_s (j+1) / K) - floor(count_s j / K) entries of source s (K shards), the next
ones of the source's pseudo-random order of its windows (a keyed Feistel permutation,
computed where needed, never materialised), shuffled within the shard.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from fm_pipeline.data.errors import DataError

SOURCE_SHIFT = 40  # window ids below 2**40 (1.1e12 windows per source); up to 2**23 sources
WINDOW_MASK = (1 << SOURCE_SHIFT) - 1
INDEX_SHARD_SAMPLES = 1 << 24  # 128 MiB of int64 entries per index shard
FEISTEL_ROUNDS = 4
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


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


def shard_plan(counts: dict[str, int], *, shard_samples: int | None = None) -> np.ndarray:
    """int64 [K, sources]: how many entries of each source index shard j holds (each
    source spread evenly over the K shards; a shard holds at most ~shard_samples, default
    INDEX_SHARD_SAMPLES)."""
    shard_samples = shard_samples or INDEX_SHARD_SAMPLES
    total = sum(counts.values())
    k = max(1, -(-total // shard_samples))
    edges = np.arange(k + 1, dtype=object)
    return np.stack([np.diff((edges * c) // k).astype(np.int64) for c in counts.values()],
                    axis=1)


def index_shards(counts: dict[str, int], windows: dict[str, int], *, seed: int,
                 shard_samples: int | None = None) -> Iterator[np.ndarray]:
    """The index, shard by shard: int64 entries `source_id << SOURCE_SHIFT | window`.

    `counts` and `windows` are keyed by source name in mix order (source_id = position).
    Source s's entries are the first counts[s] of a seeded permutation of its windows, so no
    window repeats within a pass."""
    plan = shard_plan(counts, shard_samples=shard_samples)
    taken = np.zeros(len(counts), dtype=np.int64)
    names = list(counts)
    for j, row in enumerate(plan):
        parts = []
        for source_id, n in enumerate(row):
            order = np.arange(taken[source_id], taken[source_id] + n, dtype=np.int64)
            chosen = permute(order, windows[names[source_id]], key=(seed, source_id))
            parts.append(chosen | (np.int64(source_id) << SOURCE_SHIFT))
        taken += row
        entries = np.concatenate(parts)
        yield entries[np.random.default_rng([seed, 1 << 20, j]).permutation(len(entries))]


def build_sample_index(counts: dict[str, int], windows: dict[str, int], *, seed: int,
                       shard_samples: int | None = None) -> np.ndarray:
    """The whole index at once (small mixes, tests): the shards, concatenated."""
    return np.concatenate(list(index_shards(counts, windows, seed=seed,
                                            shard_samples=shard_samples)))


def permute(k: np.ndarray, n: int, *, key: tuple[int, int]) -> np.ndarray:
    """A keyed pseudo-random bijection of [0, n), at positions `k`: a balanced Feistel
    network over the smallest even power of two >= n, cycle-walked back into range
    (each walk step stays a bijection; fewer than 4 steps expected)."""
    if n <= 0:
        raise DataError(f"cannot permute an empty range (n={n})")
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = [np.uint64(int(x)) for x in np.random.default_rng(list(key)).integers(
        0, 1 << 62, size=FEISTEL_ROUNDS)]
    out = np.asarray(k, dtype=np.uint64).copy()
    todo = np.ones(len(out), dtype=bool)
    while todo.any():
        x = out[todo]
        left, right = x >> np.uint64(half), x & mask
        for rk in keys:
            left, right = right, left ^ (_mix(right ^ rk) & mask)
        out[todo] = (left << np.uint64(half)) | right
        todo &= out >= np.uint64(n)
    return out.astype(np.int64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit reaches every output bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9) & _M64
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB) & _M64
        return x ^ (x >> np.uint64(31))


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
