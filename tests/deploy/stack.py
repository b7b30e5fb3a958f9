"""A Dagster deployment for a test, as a user runs one: the instance's dagster.yaml
(deploy/instance.py: the run queue, the local run launcher, run monitoring), a real
`dagster-daemon` and, if asked, `dagster-webserver`, and `fm api serve` processes, all on
127.0.0.1, stopped at the end.

    with deployment(fm_home, env=env) as stack:          # sqlite under fm_home/dagster
        stack.instance                                   # the same instance, in the test
        with stack.api_server(tenants) as base: ...      # http://127.0.0.1:PORT
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from dagster import DagsterInstance

from fm_pipeline.deploy.instance import Postgres, Sqlite, write_instance
from fm_pipeline.deploy.services import daemon, running, webserver
from tests.conftest import REPO, free_port


@dataclass
class Stack:
    root: Path  # FM_HOME
    home: Path  # DAGSTER_HOME
    instance: DagsterInstance
    env: dict[str, str]
    storage: Sqlite | Postgres
    webserver_url: str | None = None
    servers: list = field(default_factory=list)

    @contextlib.contextmanager
    def api_server(self, tenants: dict, *, keep_daemon: bool = False, name: str = "api"):
        """`fm api serve` on a free port with these tenants; yields its base URL. By default
        it leaves the daemon to the stack's (--no-daemon)."""
        port = free_port()
        tenants_file = self.root / f"{name}-tenants.yaml"
        tenants_file.write_text(yaml.safe_dump(tenants))
        argv = [sys.executable, "-m", "fm_pipeline.cli.api", "serve", "--port", str(port),
                "--tenants", str(tenants_file), "--tick-s", "0.5"]
        if isinstance(self.storage, Postgres):
            argv += ["--postgres", self.storage.url]
        if not keep_daemon:
            argv.append("--no-daemon")
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **self.env},
                                    stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"{name} did not come up: {log.read_text()}"
                time.sleep(0.2)
            yield base
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError(f"{name} ignored SIGTERM: {log.read_text()[-3000:]}")


@contextlib.contextmanager
def deployment(root: Path, *, storage: Sqlite | Postgres = Sqlite(),
               webserver_port: int | None = None, env: dict[str, str] | None = None,
               with_daemon: bool = True):
    """The instance in root/dagster, its daemon (and webserver) running; yields a Stack.
    `with_daemon=False`: the API servers keep it (`fm api serve` does by default)."""
    env = {"FM_HOME": str(root), "DAGSTER_HOME": str(root / "dagster"),
           "FM_LAUNCHER_ECHO": "0", "MLFLOW_LOGGING_LEVEL": "WARNING", **(env or {})}
    home = write_instance(root / "dagster", storage=storage)
    services = [daemon(home, env=env)] if with_daemon else []
    if webserver_port:
        services.append(webserver(home, port=webserver_port, env=env))
    with running(*services):
        instance = DagsterInstance.from_config(str(home))
        try:
            yield Stack(root=root, home=home, instance=instance, env=env, storage=storage,
                        webserver_url=webserver_port and f"http://127.0.0.1:{webserver_port}")
        finally:
            instance.dispose()


def wait_for(what: str, predicate, timeout_s: float = 240.0, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


def use_home(mp, home: Path) -> None:
    """Point FM_HOME, DAGSTER_HOME and FM_STORE_URI (home/store) at `home` through the
    monkeypatch `mp`; MLflow falls back to the sqlite store under it."""
    for key, value in {"FM_HOME": home, "DAGSTER_HOME": home / "dagster",
                       "FM_STORE_URI": home / "store"}.items():
        mp.setenv(key, str(value))
    mp.delenv("FM_MLFLOW_URI", raising=False)
