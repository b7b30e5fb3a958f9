"""`fm api serve` as an operator runs it, for the operational faults: a process of its own on
a free port of 127.0.0.1, in the workspace's FM_HOME, keeping the instance's dagster-daemon
(sqlite under FM_HOME/dagster), killable outright.

    with ApiServer(ws.home, tenants, env=env).start() as api:    # /healthz answers
        httpx.post(f"{api.base}/v1/training/jobs", ...)
        api.kill()                                               # SIGKILL: no cleanup
    # on leaving: the server stopped, and the daemon it kept (killed servers leave theirs)

The daemon is its own process group (deploy/services.py) holding DAGSTER_HOME/daemon.lock
with its pid in it: `daemon_pid()` finds whichever daemon serves now.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from fm_pipeline.deploy.exclusive import held
from fm_pipeline.launch.reaper import proc_stat
from fm_pipeline.resilience.ports import free_port

START_TIMEOUT_S = 180.0


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = proc_stat(int(entry.name)) if entry.name.isdigit() else []
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


class ServerGone(RuntimeError):
    """`fm api serve` exited before it answered."""


class ApiServer:
    def __init__(self, home: Path, tenants: dict, *, env: dict[str, str] | None = None,
                 name: str = "api"):
        self.home, self.name = Path(home), name
        self.env = {**os.environ, "FM_HOME": str(self.home),
                    "DAGSTER_HOME": str(self.home / "dagster"), **(env or {})}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = self.home / "services" / f"{name}.log"
        self.tenants_file = self.home / "services" / f"{name}-tenants.yaml"
        self.tenants = tenants
        self.process: subprocess.Popen | None = None

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    def start(self, *, env: dict[str, str] | None = None) -> ApiServer:
        """Start (again, on the same port) and wait for /healthz; `env` adds to this start
        only (a fail point armed for one life of the server)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.tenants_file.write_text(yaml.safe_dump(self.tenants), encoding="utf-8")
        argv = [sys.executable, "-m", "fm_pipeline.cli.api", "serve", "--port", str(self.port),
                "--tenants", str(self.tenants_file), "--tick-s", "0.5"]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(argv, env={**self.env, **(env or {})},
                                            stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if self.process.poll() is not None:
                raise ServerGone(f"{self.name} exited {self.process.returncode} before it "
                                 f"answered: {self.tail()}")
            if time.monotonic() > deadline:
                raise ServerGone(f"{self.name} did not answer within {START_TIMEOUT_S:.0f} s: "
                                 f"{self.tail()}")
            time.sleep(0.25)
        return self

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> int:
        """SIGKILL to the server process alone (its daemon is another process group)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        return self.process.wait(30)

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.process.wait(timeout_s) if self.process else None
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            if self.wait_exit(60) is None:
                self.process.kill()
                self.process.wait(30)
        self.stop_daemon()

    def daemon_pid(self) -> int | None:
        """The pid of the dagster-daemon serving this instance now (its lock's holder)."""
        lock = self.dagster_home / "daemon.lock"
        if not held(lock):
            return None
        try:
            return int(lock.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop_daemon(self, grace_s: float = 20.0) -> None:
        """End a daemon nobody stops any more (a killed server's): its whole group."""
        pid = self.daemon_pid()
        if pid is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.daemon_pid() == pid:
                time.sleep(0.2)
            if self.daemon_pid() != pid:
                return

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
