"""Shared fixtures: an isolated FM_HOME per test, a real S3 endpoint on loopback."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True, scope="session")
def cpu_peaks_file(tmp_path_factory) -> Iterator[Path]:
    """One machine, one measurement of its CPU's matmul peaks (fm_pipeline.cpu_peaks) for
    every test's FM_HOME and the processes they start, as on a host with many homes."""
    path = tmp_path_factory.mktemp("host") / "cpu-peaks.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FM_CPU_PEAKS_FILE", str(path))
        yield path


@pytest.fixture(autouse=True)
def fm_home(tmp_path, monkeypatch) -> Iterator[Path]:
    """Every test gets its own state directory; nothing leaks into the repo's .fm/."""
    home = tmp_path / "fm_home"
    home.mkdir()
    monkeypatch.setenv("FM_HOME", str(home))
    monkeypatch.delenv("FM_STORE_URI", raising=False)
    monkeypatch.delenv("FM_MLFLOW_URI", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    (home / "dagster").mkdir()
    yield home
    _forget_dagster_instance()


@pytest.fixture
def site(fm_home):
    """The test's Site (config.site): what the code below the entry points is handed."""
    from fm_pipeline.config.site import Site

    return Site.from_environ()


def _forget_dagster_instance() -> None:
    """An instance entered without being exited (DagsterInstance.get() in a test, a run
    executed in process) leaves itself as the current definitions-state storage of this
    thread; once it is garbage-collected, the next test that loads Definitions fails with
    "undefined DagsterInstance weakref". Each test starts without one."""
    if "dagster._core.storage.defs_state.base" in sys.modules:
        sys.modules["dagster._core.storage.defs_state.base"]._current_storage.set(None)


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 HTTP endpoint (moto's server) on 127.0.0.1, stopped after the session."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch) -> str:
    """A fresh bucket on the loopback endpoint; returns its name."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FM_S3_ENDPOINT_URL", s3_endpoint)
    name = f"fm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name
