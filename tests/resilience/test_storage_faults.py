"""Storage faults in real runs: the S3 endpoint dies in the middle of a checkpoint upload
(training goes on, nothing half-uploaded is committed remotely, pending uploads go through
later), and the checkpoint disk fills up (a real tmpfs: the save fails, naming it)."""

from __future__ import annotations

import pytest

from fm_pipeline.catalog import CheckpointRef, validate
from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.resilience.scenarios.storage import DISK_BYTES, s3_down
from tests.resilience.records_check import assert_figures_agree

pytestmark = pytest.mark.slow


def test_s3_down_mid_upload_keeps_training_and_commits_nothing_partial(chaos_ws):
    with chaos_ws.active():
        result = s3_down(chaos_ws)
    assert result.passed, result.failed_checks() or result.error
    assert "step-00000004/" in result.injected  # the request the endpoint died on
    # Read from the records: nothing trained twice, nothing ended, nothing resumed.
    assert (result.steps_lost, result.detect_s, result.resume_s) == (0, None, None)
    with chaos_ws.active():
        assert_figures_agree(result, chaos_ws.site.runs_dir("chaos-s3-down"))


def test_disk_full_fails_the_save_naming_it_and_the_partial_checkpoint_is_never_chosen(
        chaos_ws, live_segment, small_disk_at):
    ws = chaos_ws
    with ws.active():
        job = ws.job("disk-full")
        ws.prepare(job)
        small_disk_at(chaos_ws.site.runs_dir(job.name) / "checkpoints", DISK_BYTES)
        result = live_segment(job).result()
        newest, skipped = ws.newest_valid(job)
        first = validate(CheckpointRef.local(ws.checkpoint_dir(job.name, 2)), job)
    assert result.outcome is Outcome.FAILED
    assert "CheckpointSaveError: checkpoint at step 4 did not commit" in result.reason
    assert "0.0 MB free where the checkpoint is written" in result.reason
    assert newest == 2 and first == []
    (partial,) = skipped
    assert "step-00000004" in partial and "manifest.json: missing" in partial
