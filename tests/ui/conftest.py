"""The Dagster webserver on 127.0.0.1 over a fresh instance (DAGSTER_HOME in the test's
FM_HOME), and headless Chromium to look at it the way a user does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port
from tests.ui.processes import stop_group

START_TIMEOUT_S = 180
LOCATION = "fm_pipeline"  # workspace.yaml's location_name

# Runs start as soon as they are submitted (no daemon): the default QueuedRunCoordinator
# would leave them queued, and a daemon would also tick other areas' sensors mid-test.
INSTANCE_YAML = """\
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
telemetry:
  enabled: false
"""

@dataclass
class Webserver:
    url: str
    port: int
    dagster_home: Path
    log: Path

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        response = httpx.post(f"{self.url}/graphql", timeout=30,
                              json={"query": query, "variables": variables or {}})
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return body["data"]


@pytest.fixture
def webserver(fm_home) -> Webserver:
    """`dagster-webserver -w workspace.yaml` in its own process group (so SIGTERM stops it
    and its code server), stopped after the test."""
    dagster_home = fm_home / "dagster"
    (dagster_home / "dagster.yaml").write_text(INSTANCE_YAML)
    port = free_port()
    log = fm_home / "webserver.log"
    env = {**os.environ, "FM_HOME": str(fm_home), "DAGSTER_HOME": str(dagster_home)}
    cmd = [str(Path(sys.executable).parent / "dagster-webserver"), "-w", "workspace.yaml",
           "-h", "127.0.0.1", "-p", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Webserver(url=f"http://127.0.0.1:{port}", port=port, dagster_home=dagster_home,
                       log=log)
    try:
        _wait_loaded(server, proc)
        yield server
    finally:
        stop_group(proc)


def _wait_loaded(server: Webserver, proc: subprocess.Popen) -> None:
    """Up, and the code location loaded (a broken definitions module fails here, loudly)."""
    query = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
        locationOrLoadError { __typename ... on PythonError { message stack } } } } } }"""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited {proc.returncode}:\n{_tail(server.log)}")
        try:
            entries = server.graphql(query)["workspaceOrError"]["locationEntries"]
        except (httpx.HTTPError, ValueError):
            entries = []
        entry = next((e for e in entries if e["name"] == LOCATION), None)
        if entry and entry["loadStatus"] == "LOADED":
            loaded = entry["locationOrLoadError"]
            if loaded["__typename"] == "PythonError":
                raise RuntimeError(f"code location {LOCATION} failed to load:\n"
                                   f"{loaded['message']}{''.join(loaded['stack'])[-3000:]}")
            return
        time.sleep(0.5)
    raise RuntimeError(f"dagster-webserver not ready after {START_TIMEOUT_S} s:\n"
                       f"{_tail(server.log)}")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser binary. Missing is a failure, not a skip: CI installs it (.ci/run)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium is needed for the UI test and was not found on PATH; "
                "install it: apt-get update && apt-get install -y chromium")

