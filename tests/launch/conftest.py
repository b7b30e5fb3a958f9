"""Job specs and helpers for launcher tests; the stand-in worker is tests/launch/tiny_worker.py,
the kube-apiserver test double tests/launch/kube_api_double.py."""

from __future__ import annotations

import pytest
import yaml

from fm_pipeline.config import JobSpec, parse_job
from tests.launch.kube_api_double import KubeApiDouble

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


@pytest.fixture
def api():
    """The kube-apiserver TEST DOUBLE on 127.0.0.1 (the test plays controllers and kubelet)."""
    with KubeApiDouble() as server:
        yield server


def kubeconfig(tmp_path, api: KubeApiDouble) -> str:
    """A kubeconfig file pointing at the double."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "double", "cluster": {"server": api.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "double", "user": "u"}}],
    }))
    return str(path)
