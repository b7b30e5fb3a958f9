"""The training data mix: corpus readers, cleaning and dedup, tokenizer, token shards, the
mix manifest with its global sample index, and the resumable data-parallel loader.

    from fm_pipeline.data import mix_key, open_mix, prepare_mix, MixLoader
    manifest = prepare_mix(job, store)                   # or `fm data prepare --job JOB.yaml`
    mix = open_mix(store, mix_key(job))
    loader = MixLoader(mix, dp_rank=r, dp_size=dp, micro_batch_size=mbs,
                       global_batch_size=gbs, seq_len=job.training.seq_len)

`MixLoader` (torch) and the preparation stages import lazily, so opening a mix stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fm_pipeline.data.errors import CorruptShardError, DataError
from fm_pipeline.data.manifest import MixManifest, mix_key, mix_prefix, tokenizer_key
from fm_pipeline.data.mix import Mix, MixRef, open_mix
from fm_pipeline.lazy import lazy_exports

if TYPE_CHECKING:
    from fm_pipeline.data.loader import MixLoader
    from fm_pipeline.data.pipeline import prepare_mix

_LAZY = {"MixLoader": "fm_pipeline.data.loader", "prepare_mix": "fm_pipeline.data.pipeline"}


__getattr__ = lazy_exports(__name__, _LAZY)


def open_job_mix(job, store, *, cache_dir=None) -> Mix:
    """The published mix of `job` in `store`; `cache_dir` (site.data_cache) keeps the shards
    of a remote store."""
    return open_mix(store, mix_key(job), cache_dir=cache_dir)


__all__ = [
    "CorruptShardError", "DataError", "Mix", "MixLoader", "MixRef", "MixManifest", "mix_key", "mix_prefix",
    "open_job_mix", "open_mix", "prepare_mix", "tokenizer_key",
]
