"""The Dagster processes of a deployment, started and stopped by fm (the demo, `make ui`,
tests): dagster-daemon (sensors, the schedule, the run queue, run monitoring) and
dagster-webserver (the UI and GraphQL).

    with running(daemon(home), webserver(home, port=3000)):   # both ready, both stopped after
        ...
    with kept(lambda: daemon(home)):    # a daemon serves the instance as long as this runs
        ...                             # (started again whenever none does)

Signal dispositions are explicit for every process started here: a shell that runs fm in
the background (`&`, nohup, a CI runner) leaves SIGINT ignored, Dagster then maps SIGTERM to
SIGINT's disposition, and the whole tree (code server, run workers, their log tailers)
would ignore SIGTERM: every step would wait out its children's timeouts and nothing could be
stopped short of SIGKILL. Each child gets the default SIGINT and SIGTERM and its own process
group, so stopping it (SIGTERM to the group, SIGKILL after a grace) reaches everything it
started. fm itself resets them at start (`default_signal_dispositions`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fm_pipeline.deploy.exclusive import ALREADY_RUNNING, held

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 20.0


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def default_signal_dispositions() -> None:
    """In fm itself: SIGINT raises KeyboardInterrupt again (if a shell ignored it) and SIGTERM
    exits through the `finally` blocks, so the services this process started are stopped."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)


def _child_dispositions() -> None:  # runs in the child, between fork and exec
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (the venv fm runs from)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


@dataclass
class Service:
    name: str
    argv: list[str]
    home: Path  # DAGSTER_HOME
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    ready_url: str | None = None  # HTTP endpoint that answers once it serves
    ready_line: str | None = None  # a line its log prints once it works
    # Exit code meaning "one already serves this instance" (exclusive.py): ready, not ours.
    already_running: int | None = None
    lock: Path | None = None  # held by the one instance of it that serves (already_running)
    process: subprocess.Popen | None = None

    @property
    def shared(self) -> bool:
        """Another process's instance of this service serves (this one exited at once)."""
        return (self.process is not None and self.already_running is not None
                and self.process.poll() == self.already_running)

    def start(self) -> Service:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        env = {**os.environ, "DAGSTER_HOME": str(self.home), **self.env}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                self.argv, cwd=self.home, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_child_dispositions)
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> Service:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.shared:
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before "
                                   f"it was ready; its log: {self.log}\n{self.tail()}")
            if self._ready():
                return self
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s; its log: "
                           f"{self.log}\n{self.tail()}")

    def _ready(self) -> bool:
        if self.ready_url:
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        if self.ready_line:  # in what this start wrote (the log is appended to)
            try:
                with open(self.log, "rb") as f:
                    f.seek(getattr(self, "_log_start", 0))
                    return self.ready_line.encode() in f.read()
            except FileNotFoundError:
                return False
        return True

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to its process group, SIGKILL after `grace_s`; then the same to whatever
        it started in sessions of their own (Dagster's code servers: they are meant to exit
        when their heartbeat stops, but one whose storage went away first stays forever).
        Returns its exit code."""
        from fm_pipeline.launch.local import descendants

        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        tree = descendants(self.process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            code = self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait(10)
        _end(tree, grace_s=5.0)
        return code


def _end(pids: list[int], *, grace_s: float) -> None:
    """SIGTERM the processes still alive, SIGKILL those left after `grace_s`."""
    def alive() -> list[int]:
        return [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]

    for pid in alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def daemon(home: Path, *, env: dict[str, str] | None = None) -> Service:
    """dagster-daemon for the instance in `home` (its workspace.yaml, deploy/instance.py);
    ready once its sensor daemon evaluated the code location's sensors. It holds
    `home`/daemon.lock for its life: where another fm already started one for this instance,
    that one serves (`shared`) and stopping this Service stops nothing."""
    home = Path(home)
    return Service("dagster-daemon", [
        sys.executable, "-m", "fm_pipeline.deploy.exclusive", str(home / "daemon.lock"), "--",
        _bin("dagster-daemon"), "run", "-w", str(home / "workspace.yaml")],
        home=home, log=home / "services" / "daemon.log", env=dict(env or {}),
        ready_line="Checking for new runs for sensor", already_running=ALREADY_RUNNING,
        lock=home / "daemon.lock")


def webserver(home: Path, *, port: int, host: str = "127.0.0.1",
              env: dict[str, str] | None = None) -> Service:
    return Service("dagster-webserver", [
        _bin("dagster-webserver"), "-w", str(Path(home) / "workspace.yaml"), "-h", host,
        "-p", str(port)], home=Path(home), log=Path(home) / "services" / "webserver.log",
        env=dict(env or {}), ready_url=f"http://{host}:{port}/server_info")


@contextlib.contextmanager
def running(*services: Service, timeout_s: float = READY_TIMEOUT_S):
    """Start every service, wait until each is ready, stop them all (last first) after."""
    started: list[Service] = []
    try:
        for service in services:
            started.append(service.start())
        for service in started:
            service.wait_ready(timeout_s)
        yield started
    finally:
        for service in reversed(started):
            service.stop()


@contextlib.contextmanager
def kept(make, *, every_s: float = 5.0, timeout_s: float = READY_TIMEOUT_S):
    """A service of which one instance must always serve (the daemon of an instance several
    fm processes share): start `make()`; every `every_s`, when none serves any more (ours
    died, or the other process's one stopped: its lock is free), start another. Ours is
    stopped at the end."""
    current = [make().start().wait_ready(timeout_s)]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(every_s):
            service = current[0]
            alive = service.process.poll() is None
            if alive or (service.lock is not None and held(service.lock)):
                continue
            log.warning("%s: none serves this instance any more; starting one", service.name)
            try:
                current[0] = make().start().wait_ready(timeout_s)
            except RuntimeError as e:  # try again next time
                log.warning("%s did not start: %s", service.name, e)

    watcher = threading.Thread(target=watch, daemon=True, name=f"keep-{current[0].name}")
    watcher.start()
    try:
        yield current
    finally:
        stop.set()
        watcher.join(timeout=timeout_s + every_s)
        current[0].stop()
