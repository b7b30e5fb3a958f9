"""Job specs and helpers for launcher tests; the stand-in worker is tests/launch/tiny_worker.py."""

from __future__ import annotations

import pytest

from fm_pipeline.config import JobSpec, parse_job

TINY_WORKER = "tests.launch.tiny_worker"


def tiny_job(*, name: str = "tiny", nnodes: int = 1, nproc: int = 2, **sections) -> JobSpec:
    spec = {
        "name": name,
        "parallelism": {"nnodes": nnodes, "nproc_per_node": nproc},
        "training": {"steps": 40, "warmup_steps": 1, "seq_len": 64, "global_batch_size": 8,
                     "micro_batch_size": 2},
        "data": {"sources": [{"name": "code", "uri": "python-stdlib", "format": "python-code",
                              "weight": 1.0}]},
    }
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_job(spec)


@pytest.fixture
def job2() -> JobSpec:
    """Two ranks on one machine."""
    return tiny_job()
