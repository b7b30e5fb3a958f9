"""Deployment fixtures. Each test gets a store of its own with the session's prepared mix in
it: a daemon's intake sensor starts every submission it finds in its store, so a job one
test left queued or running (its control plane still requeueing it) would otherwise train
inside the next test's deployment."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.api.conftest import mix_in, prepare_mix, tokens  # noqa: F401  (shared fixture)


@pytest.fixture(scope="session")
def prepared_mix(tmp_path_factory) -> dict:
    return prepare_mix(tmp_path_factory.mktemp("mix-store"))


@pytest.fixture
def mix_store(prepared_mix, tmp_path) -> dict:
    root = tmp_path / "store"
    shutil.copytree(Path(prepared_mix["root"]) / "data", root / "data")
    return mix_in(root, prepared_mix["key"])
