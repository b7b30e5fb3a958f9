"""How the suite shares the machine's cores when `make test` runs it on two xdist workers.

Tests marked `slow` or `server` run alone: they start process groups, daemons and servers
whose timings they check (a rank slowed on purpose must be the only straggler, an eviction
must land inside a segment), so they take the machine exclusively. Every other test holds
it shared, two at a time. A reader-writer lock on files in a directory the workers share
does it, with a turnstile so a waiting exclusive test is not starved by the other worker's
stream of short ones. Without xdist (one process) nothing is locked.

Tests are handed to the workers in groups so that fixtures built once per session or module
(the trainer's layouts launch, a prepared mix, an MLflow server) are built once, on one
worker: a directory whose conftest has session fixtures is one group, any other module is
its own.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

EXCLUSIVE_MARKS = ("slow", "server")
# Directories whose conftest.py builds session-scoped fixtures their modules share.
SESSION_GROUPS = ("api", "data", "deploy", "devcluster", "resilience", "tracking", "train",
                  "ui")


def runs_alone(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) for mark in EXCLUSIVE_MARKS)


def group_of(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    parts = Path(module).parts
    if len(parts) > 2 and parts[1] in SESSION_GROUPS:
        return f"tests/{parts[1]}"
    return module


def _lock_dir(config: pytest.Config) -> Path | None:
    """The run's base temporary directory, which xdist gives each worker a folder under
    (pytest removes old ones)."""
    if getattr(config, "workerinput", None) is None or not config.option.basetemp:
        return None
    return Path(config.option.basetemp).parent


@contextmanager
def holding_cores(directory: Path, *, exclusive: bool):
    turnstile = os.open(directory / "turnstile", os.O_CREAT | os.O_RDWR)
    cores = os.open(directory / "cores", os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(cores, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(cores)  # closing drops the lock
        os.close(turnstile)


def pytest_configure(config):
    """A plugin imports readline, which writes LINES=24 and COLUMNS=80 into the process's C
    environment (not os.environ); the workers would inherit them and every rich console
    would print 80 wide. The workers get the environment the shell gave."""
    for name in ("COLUMNS", "LINES"):
        if name not in os.environ:
            os.unsetenv(name)


def pytest_xdist_make_scheduler(config, log):
    """xdist's load-scope scheduling with the groups above as its scopes (its loadgroup
    marks do not reach the scheduler under pytest 9: they rename a field pytest no longer
    reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Outside pytest-timeout's wrapper: the wait for the cores is not the test's time."""
    directory = _lock_dir(item.config)
    if directory is None:
        yield
        return
    with holding_cores(directory, exclusive=runs_alone(item)):
        yield
