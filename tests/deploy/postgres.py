"""A real PostgreSQL server for a test: Debian's postgresql package, `initdb` into a
temporary directory, `pg_ctl` on 127.0.0.1 with a free port, stopped (fast) at the end.
PostgreSQL refuses to run as root: as root the server runs as the `postgres` user, in a
directory of its own (NOTES-stack.md)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} not found: install Debian's postgresql "
                           "package (.ci/run does)")
    return found[-1]


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def postgres_server(database: str = "dagster"):
    """Yields the URL of a fresh database on a server of its own."""
    root = Path(tempfile.mkdtemp(prefix="fm-pg-"))  # not under pytest's 0700 tmp dirs
    data = root / "data"
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = free_port()
    subprocess.run(_as_postgres([_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "fm"]),
                   check=True, capture_output=True)
    subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                                 "-o", f"-h 127.0.0.1 -p {port} -k {root}", "-w", "start"]),
                   check=True, capture_output=True)
    try:
        subprocess.run(_as_postgres([_bin("createdb"), "-h", "127.0.0.1", "-p", str(port),
                                     "-U", "fm", database]), check=True, capture_output=True)
        yield f"postgresql://fm@127.0.0.1:{port}/{database}"
    finally:
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
