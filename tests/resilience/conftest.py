"""Fixtures that inject faults into real local runs.

    chaos_ws        one ChaosWorkspace (FM_HOME + the small data mix) for the session
    live_segment    start a LiveSegment of a job; anything left of it is killed at teardown
    needs_root      skip with the reason when mounts / network namespaces are impossible
"""

from __future__ import annotations

import os

import pytest

from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.workspace import ChaosWorkspace


@pytest.fixture(scope="session")
def chaos_ws(tmp_path_factory) -> ChaosWorkspace:
    return ChaosWorkspace(tmp_path_factory.mktemp("chaos"))


@pytest.fixture
def live_segment():
    started: list[LiveSegment] = []

    def start(job, *, end_step: int | None = None, env=None, overrides=()) -> LiveSegment:
        launch = SegmentLaunch(job, end_step=end_step or job.training.steps,
                               overrides=tuple(overrides))
        live = LiveSegment(launch, env=env, timeout_s=300).start()
        started.append(live)
        return live

    yield start
    for live in started:
        live.cleanup()


@pytest.fixture
def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a tmpfs / creates network namespaces")
