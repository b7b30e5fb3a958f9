"""A real, small data mix for other areas' tests (trainer, checkpoint, eval, orchestration).

    from fm_pipeline.data.testing import build_small_mix, small_job
    job = small_job(**{"training.seq_len": 64})          # debug model + the small data section
    mix = build_small_mix(job, store=site.store())       # prepared in the store, ~2 s

The corpus is real text: the `email` package of this interpreter's standard library as a
"code" domain and its docstrings/comments as a "prose" domain (~60k tokens with the
default 512-token vocabulary), cut into small shards so that multi-shard paths are exercised.
"""

from __future__ import annotations

import copy
from typing import Any

from fm_pipeline.config import JobSpec, parse_job
from fm_pipeline.config.load import set_dotted
from fm_pipeline.data.mix import Mix, open_mix
from fm_pipeline.storage import ObjectStore

SMALL_DATA: dict[str, Any] = {
    "sources": [
        {"name": "code", "uri": "python-stdlib", "format": "python-code", "glob": "email/*.py",
         "weight": 0.5},
        {"name": "prose", "uri": "python-stdlib", "format": "python-docstrings",
         "glob": "email/**/*.py", "weight": 0.5},
    ],
    "min_chars": 32,
    "shard_tokens": 8192,
    "heldout_fraction": 0.1,
}

SMALL_JOB: dict[str, Any] = {
    "name": "small",
    "model": {"size": "debug", "vocab_size": 512},
    "parallelism": {"nproc_per_node": 1},
    "training": {"seq_len": 32, "global_batch_size": 8, "micro_batch_size": 2, "steps": 4,
                 "segment_steps": 2, "warmup_steps": 1},
    "data": SMALL_DATA,
    "checkpoint": {"every_steps": 2},
}


def small_job(**overrides: Any) -> JobSpec:
    """The small job spec; `overrides` are dotted keys, e.g. `**{"parallelism.nproc_per_node": 2}`."""
    data = copy.deepcopy(SMALL_JOB)
    for key, value in overrides.items():
        set_dotted(data, key, value)
    return parse_job(data, source="<small_job>")


def build_small_mix(job: JobSpec | None = None, *, store: ObjectStore) -> Mix:
    """Prepare (or reuse) `job`'s mix in `store` and open it."""
    from fm_pipeline.data.manifest import mix_key
    from fm_pipeline.data.pipeline import prepare_mix

    job = job or small_job()
    prepare_mix(job, store)
    return open_mix(store, mix_key(job))
