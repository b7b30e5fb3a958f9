"""Fixtures that inject faults into real local runs.

    chaos_ws        one ChaosWorkspace (FM_HOME + the small data mix) for the session
    live_segment    start a LiveSegment of a job; anything left of it is killed at teardown
    small_disk_at   a real tmpfs over a directory (the disk-full fault), or a skip
"""

from __future__ import annotations

import contextlib

import pytest

from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience.injectors import Unavailable, small_disk
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.workspace import ChaosWorkspace


@pytest.fixture(scope="session")
def chaos_ws(tmp_path_factory) -> ChaosWorkspace:
    return ChaosWorkspace(tmp_path_factory.mktemp("chaos"))


@pytest.fixture
def live_segment(chaos_ws):
    """Segments of jobs in the chaos workspace (its Site)."""
    started: list[LiveSegment] = []

    def start(job, *, end_step: int | None = None, env=None, overrides=()) -> LiveSegment:
        launch = SegmentLaunch(job, end_step=end_step or job.training.steps,
                               overrides=tuple(overrides))
        live = LiveSegment(launch, env=env, timeout_s=300, site=chaos_ws.site).start()
        started.append(live)
        return live

    yield start
    for live in started:
        live.cleanup()


@pytest.fixture
def small_disk_at():
    """mount(directory, size_bytes): a real tmpfs over `directory` until the test ends;
    fails with the reason where mounting is impossible (not root, no CAP_SYS_ADMIN): the
    test cannot show what it claims without a real small disk."""
    with contextlib.ExitStack() as stack:

        def mount(directory, size_bytes: int):
            try:
                return stack.enter_context(small_disk(directory, size_bytes=size_bytes))
            except Unavailable as e:
                pytest.fail(f"needs a real small disk (tmpfs mount, as root): {e}")

        yield mount
