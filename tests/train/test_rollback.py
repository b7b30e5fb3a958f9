"""Rollback: resuming from an older checkpoint (a loss spike, bad data) continues the job from
there. The newer checkpoints of the abandoned continuation are superseded in both tiers: no
discovery selects them again, `fm ckpt list` and the API say why, the new continuation saves
the same steps again, and the next plain segment resumes the new timeline. One rank, the
debug model, an S3 endpoint on loopback with uploads on.
"""

from __future__ import annotations

import os
import shutil

import pytest
from typer.testing import CliRunner

from fm_pipeline.api import progress
from fm_pipeline.catalog import CheckpointRef, latest_valid, read_manifest
from fm_pipeline.catalog.set_aside import list_set_aside
from fm_pipeline.cli.ckpt import app as ckpt_app
from fm_pipeline.config import load_job
from fm_pipeline.data.testing import build_small_mix
from fm_pipeline.rundir.records import read_records
from tests.train.launch import env_for, failure, train, write_job
from tests import local_site

pytestmark = pytest.mark.slow

JOB = "rollback"


def _newest(job, store, tier: str):
    found = latest_valid(job, store=store, tiers=(tier,), checksums=False, root=local_site.root_of(job))
    return found.found, read_manifest(found.found), found.skipped_lines()


def _corrupt_copy(src, dest):
    """A copy of a checkpoint whose largest shard has one byte flipped (same size)."""
    shutil.copytree(src, dest)
    shard = max(dest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_rollback_continues_from_the_chosen_checkpoint_in_both_tiers(fm_home, s3_bucket,
                                                                     tmp_path):
    store_uri = f"s3://{s3_bucket}/fm"
    env = env_for(fm_home, FM_STORE_URI=store_uri,
                  FM_S3_ENDPOINT_URL=os.environ["FM_S3_ENDPOINT_URL"])
    path = write_job(tmp_path, JOB, nproc=1, **{
        "training.steps": 40, "training.segment_steps": 10, "checkpoint.every_steps": 10,
        "checkpoint.upload": True})
    job, store = load_job(path), local_site.site().open_store(store_uri)
    build_small_mix(job, store=store)
    ckpts = fm_home / "runs" / JOB / "checkpoints"

    out = train(fm_home, path, "--end-step", "30", env=env)
    assert out.returncode == 0, failure(out)
    old20 = read_manifest(CheckpointRef.local(ckpts / "step-00000020"))

    # A rollback whose restore fails (a corrupt copy of step 10) supersedes nothing.
    bad = tmp_path / "bad" / "step-00000010"
    _corrupt_copy(ckpts / "step-00000010", bad)
    out = train(fm_home, path, "--resume-from", str(bad), "--end-step", "20", env=env)
    assert out.returncode != 0 and "mismatch" in out.stdout + out.stderr
    assert not (ckpts / "superseded.json").exists()
    for tier in ("local", "store"):
        assert _newest(job, store, tier)[0].step == 30

    # Roll back to step 10 with another learning rate; train to 20 again.
    out = train(fm_home, path, "--resume-from", str(ckpts / "step-00000010"), "--end-step",
                "20", "--set", "training.lr=3e-3", env=env)
    assert out.returncode == 0, failure(out)
    new20 = read_manifest(CheckpointRef.local(ckpts / "step-00000020"))
    assert new20.job_spec["training"]["lr"] == 3e-3 and new20.probe.loss != old20.probe.loss
    for tier in ("local", "store"):
        ref, manifest, skipped = _newest(job, store, tier)
        assert (ref.step, manifest.created_at) == (20, new20.created_at), tier
        assert any("step-00000030" in line and
                   "superseded: the job was resumed from step 10 at" in line
                   for line in skipped), skipped
    # The old step 20 is set aside in both tiers (kept, with the reason), not deleted.
    (aside,) = ckpts.glob("superseded/*/step-00000020")
    assert read_manifest(CheckpointRef.local(aside)).created_at == old20.created_at
    kept = [e for e in list_set_aside(JOB, store=store, root=local_site.root_of(JOB)) if not e.ref.is_local]
    assert [(e.ref.step, e.kind) for e in kept] == [(20, "superseded")]
    assert read_manifest(kept[0].ref).created_at == old20.created_at
    assert (out.stdout + out.stderr).count("set aside (superseded: the job was resumed") == 2

    listing = CliRunner().invoke(ckpt_app, ["list", "--job", str(path), "--store", store_uri],
                                 env={"COLUMNS": "250"})
    assert listing.exit_code == 0, listing.output
    rows = [line for line in listing.output.splitlines() if "superseded" in line]
    # the old 20 set aside in both tiers, 30 superseded in both tiers
    assert [r.split()[1] for r in rows] == ["20", "20", "30", "30"], listing.output
    seen = progress.checkpoints(JOB, store, root=local_site.root_of(JOB))
    assert progress.last_committed(seen).step == 20
    assert {(c.step, c.tier) for c in seen if c.superseded} == {(30, "local"), (30, "store")}

    # The next plain segment restores the new step 20 and trains on to 40.
    out = train(fm_home, path, "--end-step", "40", env=env)
    assert out.returncode == 0, failure(out)
    last = read_records(fm_home / "runs" / JOB / "segments.jsonl", "segment")[-1]
    assert (last["start_step"], last["end_step"]) == (20, 40)
    assert last["restored_from"] == str(ckpts / "step-00000020")
    for tier in ("local", "store"):
        assert _newest(job, store, tier)[0].step == 40
