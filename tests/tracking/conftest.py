"""A real MLflow server on 127.0.0.1 for the whole session (20-30 s to start on a fresh
database, so once), and a tracker on a fresh experiment per test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.ui.processes import stop_group

START_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """`mlflow server` over a sqlite store, without its job runner (2 processes, not 9)."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts")]
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                            start_new_session=True)  # its own group: stop every worker
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, root / "server.log")
        yield url
    finally:
        stop_group(proc, grace_s=20)
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server not healthy after {START_TIMEOUT_S} s:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def experiment() -> str:
    """A fresh experiment name per test: tests on the shared server never see each other."""
    return f"test-{uuid.uuid4().hex[:10]}"
