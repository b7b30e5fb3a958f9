"""A corpus with planted near-duplicates of known Jaccard similarity, for the dedup tests and
`benchmarks.data`: originals of random words, each followed by a variant made the way mirrors
and templates make them (substitutions, insertions, re-wrapped lines, a moved paragraph).

    docs, pairs = planted_near_duplicates(300, seed=7)  # pairs: (original, variant, similarity)
"""

from __future__ import annotations

import random

from fm_pipeline.data.near_dedup import jaccard, shingles


def _words(n: int) -> list[str]:
    """`n` distinct pseudo-words of three consonant-vowel syllables, letters only (text
    normalisers that fold digits, such as datatrove's, leave them apart)."""
    rng = random.Random(0)
    words: dict[str, None] = {}
    while len(words) < n:
        words["".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(3))] = None
    return list(words)


VOCAB = _words(5000)
EDIT_RATES = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15)  # spans similarity ~0.95 down to ~0.3


def variant(words: list[str], rng: random.Random, edits: float) -> list[str]:
    """`words` with `edits` of them substituted or inserted, and sometimes a 40-word
    paragraph moved to the front."""
    out = list(words)
    for _ in range(int(edits * len(out))):
        i = rng.randrange(len(out))
        if rng.random() < 0.7:
            out[i] = rng.choice(VOCAB)
        else:
            out.insert(i, rng.choice(VOCAB))
    cut = rng.randrange(len(out) // 2)
    return out[cut:cut + 40] + out[:cut] + out[cut + 40:] if rng.random() < 0.3 else out


def wrap(words: list[str], rng: random.Random) -> str:
    """The words as lines of a random width: re-wrapping changes no word shingle."""
    width = rng.randrange(6, 20)
    return "\n".join(" ".join(words[i:i + width]) for i in range(0, len(words), width))


def planted_near_duplicates(originals: int, *, seed: int = 7, ngram: int = 5,
                            words: tuple[int, int] = (150, 400)):
    """`originals` documents each followed by one variant; returns (docs, pairs) with pairs
    (original index, variant index, true Jaccard similarity of their word `ngram`s)."""
    rng = random.Random(seed)
    docs: list[str] = []
    pairs: list[tuple[int, int, float]] = []
    for _ in range(originals):
        base = [rng.choice(VOCAB) for _ in range(rng.randrange(*words))]
        near = variant(base, rng, edits=rng.choice(EDIT_RATES))
        a, b = " ".join(base), wrap(near, rng) if rng.random() < 0.5 else " ".join(near)
        pairs.append((len(docs), len(docs) + 1, jaccard(shingles(a, ngram), shingles(b, ngram))))
        docs += [a, b]
    return docs, pairs
