"""The dev cluster's processes: started with a log each, all carrying the cluster's tag so
that `down` (or a crashed test's next start) ends every one of them, the pods the process
kubelet started included, whoever their parent is by then."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from fm_pipeline.launch.local import stop_with_parent
from fm_pipeline.launch.reaper import end_tagged, tagged

TAG_ENV = "FM_DEV_CLUSTER"


def start(name: str, argv: list[str], *, tag: str, logs: Path, attached: bool,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start one component. Attached (tests): it gets SIGTERM if this process dies.
    Detached (`fm dev cluster up`): its own session, it outlives the command."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), TAG_ENV: tag},
            start_new_session=not attached,
            preexec_fn=stop_with_parent if attached else None)


def running(tag: str) -> list[int]:
    return sorted(tagged(tag, variable=TAG_ENV))


def stop_all(tag: str, *, grace_s: float = 5.0) -> list[int]:
    """End every process carrying the cluster's tag: SIGTERM, then SIGKILL."""
    return end_tagged(tag, grace_s=grace_s, variable=TAG_ENV)


def wait_https(url: str, *, ca: Path, cert: tuple[Path, Path] | None, timeout_s: float,
               what: str, log: Path | None = None, proc: subprocess.Popen | None = None) -> None:
    """Until GET url answers 200, naming the component and the tail of its log otherwise."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    _wait(lambda: urllib.request.urlopen(url, context=context, timeout=2).status == 200,
          timeout_s=timeout_s, what=what, log=log, proc=proc)


def wait_http(url: str, *, timeout_s: float, what: str, log: Path | None = None,
              proc: subprocess.Popen | None = None) -> None:
    _wait(lambda: urllib.request.urlopen(url, timeout=2).status == 200, timeout_s=timeout_s,
          what=what, log=log, proc=proc)


class ComponentFailed(RuntimeError):
    pass


def _wait(probe, *, timeout_s: float, what: str, log: Path | None,
          proc: subprocess.Popen | None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise ComponentFailed(f"{what} exited with {proc.returncode} while starting"
                                  f"{log_tail(log)}")
        try:
            if probe():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ComponentFailed(f"{what} not ready after {timeout_s:.0f} s{log_tail(log)}")
        time.sleep(0.25)


def log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-15:]
    return f"; the end of {log}:\n" + "\n".join(lines)
