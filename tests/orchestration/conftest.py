"""Fixtures for the orchestration tests: one small real data mix and one MLflow store shared
by the module, a Dagster instance per test (the autouse FM_HOME fixture gives each test
its own DAGSTER_HOME), and helpers to run the training jobs in process."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.storage import open_store


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A store holding the small mix, and an MLflow sqlite URI (created once)."""
    root = tmp_path_factory.mktemp("orchestration")
    store_dir = root / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FM_HOME", str(root / "home"))
        build_small_mix(small_job(), store=open_store(str(store_dir)))
    return {"store": str(store_dir), "mlflow": f"sqlite:///{root / 'mlflow.db'}"}


@pytest.fixture
def env(shared, monkeypatch):
    monkeypatch.setenv("FM_STORE_URI", shared["store"])
    monkeypatch.setenv("FM_MLFLOW_URI", shared["mlflow"])
    return shared


@pytest.fixture
def instance(env, fm_home):
    (fm_home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with DagsterInstance.get() as inst:
        yield inst


def job_spec(name: str, **overrides):
    """The small job (debug model, one rank): 8 steps, segments of 4, checkpoints every 2."""
    return small_job(**{"name": name, "training.steps": 8, "training.segment_steps": 4,
                        "checkpoint.every_steps": 2, "checkpoint.keep_last": 10,
                        **overrides})
