"""The orchestrator's plan reaches the trainer as --resume-from ... --planned: the trainer
restores the planned checkpoint when it passes full validation, and otherwise the newest
one that does, saying why in the job's events ("resume_plan_differs"). Unlike a rollback
(--resume-from alone) a plan supersedes nothing. One rank, the debug model, the local tier.
"""

from __future__ import annotations

from fm_pipeline.config import load_job
from fm_pipeline.data.testing import build_small_mix
from fm_pipeline.rundir.events import read_events
from fm_pipeline.rundir.records import read_records
from tests.train.launch import failure, train, write_job
from tests import local_site

JOB = "planned"


def _flip_a_byte(checkpoint):
    """The largest shard of the checkpoint with one byte flipped (same size: only the
    checksums see it)."""
    shard = max(checkpoint.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _restored(fm_home) -> list[str | None]:
    segments = read_records(fm_home / "runs" / JOB / "segments.jsonl")
    return [s.get("restored_from") for s in segments]


def test_a_plan_that_fails_validation_falls_back_and_one_overtaken_yields(fm_home, tmp_path):
    path = write_job(tmp_path, JOB, nproc=1, **{
        "training.steps": 8, "training.segment_steps": 2, "checkpoint.every_steps": 2})
    build_small_mix(load_job(path), store=local_site.site().store())
    ckpts = fm_home / "runs" / JOB / "checkpoints"
    out = train(fm_home, path, "--end-step", "4")
    assert out.returncode == 0, failure(out)

    # The plan names step 4, whose shard no longer matches its checksum: step 2 restores.
    _flip_a_byte(ckpts / "step-00000004")
    out = train(fm_home, path, "--resume-from", str(ckpts / "step-00000004"), "--planned",
                "--end-step", "6")
    assert out.returncode == 0, failure(out)
    assert str(_restored(fm_home)[-1]).rstrip("/").endswith("step-00000002")
    (differs,), _ = read_events(local_site.runs_dir(JOB), kinds=("resume_plan_differs",))
    assert (differs["planned_step"], differs["restored_step"]) == (4, 2)
    assert "the planned checkpoint failed validation" in differs["reason"]

    # A plan the job already went past (pods recreated with the same arguments) yields to
    # the newest checkpoint, which a rollback would have superseded.
    out = train(fm_home, path, "--resume-from", str(ckpts / "step-00000002"), "--planned",
                "--end-step", "8")
    assert out.returncode == 0, failure(out)
    assert str(_restored(fm_home)[-1]).rstrip("/").endswith("step-00000006")
    _, differs = read_events(local_site.runs_dir(JOB), kinds=("resume_plan_differs",))[0]
    assert (differs["planned_step"], differs["restored_step"]) == (2, 6)
    assert "went past it" in differs["reason"]
    assert not (ckpts / "superseded.json").exists()
