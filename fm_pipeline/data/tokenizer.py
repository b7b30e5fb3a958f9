"""Byte-level BPE (the `tokenizers` library), trained on the clean corpus of a mix.

Byte-level means every UTF-8 string encodes without unknown tokens; `<|endoftext|>` (id 0)
separates documents in the token streams. The trained file is what the trainer reloads:

    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(store.get_bytes(f"data/{key}/tokenizer.json").decode())
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from fm_pipeline.data.errors import DataError
from fm_pipeline.data.manifest import EOS_TOKEN

if TYPE_CHECKING:
    import numpy as np

MIN_VOCAB = 256 + 1  # the byte alphabet plus <|endoftext|>


def train_bpe(texts: Iterable[str], *, vocab_size: int):
    """A byte-level BPE tokenizer with at most `vocab_size` ids (fewer on a tiny corpus)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB:
        raise DataError(
            f"model.vocab_size ({vocab_size}) must be >= {MIN_VOCAB}: 256 byte tokens plus "
            f"{EOS_TOKEN}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def share_encoder_cores(processes: int) -> int:
    """Give this process's encoder its share of the cores when `processes` encode side by
    side, and return its thread count. tokenizers' thread pool (rayon) otherwise takes one
    thread per core in every process: two pools of two busy threads on 2 cores encoded the
    1.2 GB benchmark corpus in 114 s, two steps of one thread each in 105 s.
    Takes effect before the process's first parallel encode or training (rayon builds its
    pool once); a RAYON_NUM_THREADS already set wins."""
    import os

    share = max(1, len(os.sched_getaffinity(0)) // max(1, processes))
    return int(os.environ.setdefault("RAYON_NUM_THREADS", str(share)))


def eos_id(tok) -> int:
    idx = tok.token_to_id(EOS_TOKEN)
    if idx is None:
        raise DataError(f"tokenizer has no {EOS_TOKEN} token")
    return idx


def encode_documents(tok, texts: list[str], *, eos: int, dtype) -> "np.ndarray":
    """Token ids of `texts`, each document followed by `eos`, as one flat array."""
    return flatten_encodings(_encode(tok, texts), eos=eos, dtype=dtype)


def encode_stream(tok, batches: Iterable[list[str]], *, eos: int, dtype) -> Iterator[tuple["np.ndarray", int]]:
    """(ids, documents) per batch of texts. The next batch is encoded on a worker thread
    (tokenizers releases the GIL and fans out over all cores) while the caller flattens and
    writes the current one, so the cores idle neither at a batch's tail nor during writes."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as pool:
        pending = None
        for texts in batches:
            future = pool.submit(_encode, tok, texts)
            if pending is not None:
                yield flatten_encodings(pending[0].result(), eos=eos, dtype=dtype), pending[1]
            pending = (future, len(texts))
        if pending is not None:
            yield flatten_encodings(pending[0].result(), eos=eos, dtype=dtype), pending[1]


def _encode(tok, texts: list[str]):
    # encode_batch_fast skips character offsets, which shards never need.
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    return encode(texts, add_special_tokens=False)


def flatten_encodings(encodings, *, eos: int, dtype) -> "np.ndarray":
    import numpy as np

    lengths = np.fromiter((len(e) + 1 for e in encodings), dtype=np.int64, count=len(encodings))
    out = np.empty(int(lengths.sum()), dtype=dtype)
    pos = 0
    for e, n in zip(encodings, lengths):
        out[pos:pos + n - 1] = e.ids
        out[pos + n - 1] = eos
        pos += n
    return out
