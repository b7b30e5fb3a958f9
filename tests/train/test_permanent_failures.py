"""Failures that no retry can fix end the trainer with the permanent exit code (2) and one
line naming the cause, not the retryable 1 and a traceback: a corrupt data shard found while
training, and a checkpoint directory on a read-only volume."""

from __future__ import annotations

import pytest

from fm_pipeline.config import load_job
from fm_pipeline.data.manifest import mix_key
from fm_pipeline.data.testing import build_small_mix
from fm_pipeline.resilience.injectors import Unavailable, read_only_dir
from fm_pipeline.storage import open_store
from tests.train.launch import train, write_job

pytestmark = pytest.mark.slow


def _worker_exit(out) -> tuple[int | None, str]:
    """The worker's own exit code and what its error file says, from torchrun's summary
    (`traceback :` holds the error file's message: one line here, not a stack)."""
    lines = (out.stdout + out.stderr).splitlines()
    field = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
             for line in lines if line.strip().startswith(("exitcode", "traceback"))}
    code = int(field["exitcode"].split()[0]) if "exitcode" in field else None
    return code, field.get("traceback", "")


def test_a_corrupt_shard_while_training_is_permanent_and_named(fm_home, tmp_path):
    path = write_job(tmp_path, "bad-shard", nproc=1)
    job = load_job(path)
    build_small_mix(job, store=open_store(fm_home / "store"))
    shards = sorted((fm_home / "store" / "data" / mix_key(job) / "shards").rglob("train-*.bin"))
    for shard in shards:  # every train shard: whichever the first batch reads
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    out = train(fm_home, path, nproc=1)
    code, error = _worker_exit(out)
    assert code == 2, out.stderr[-3000:]
    assert error.startswith("CorruptShardError: corrupted shard data/") and "sha256" in error


def test_a_read_only_checkpoint_directory_is_permanent_and_named(fm_home, tmp_path):
    path = write_job(tmp_path, "ro-ckpt", nproc=1)
    job = load_job(path)
    build_small_mix(job, store=open_store(fm_home / "store"))
    ckpts = fm_home / "runs" / job.name / "checkpoints"
    try:
        with read_only_dir(ckpts):
            out = train(fm_home, path, nproc=1)
    except Unavailable as e:
        pytest.fail(f"needs a read-only mount (root): {e}")
    code, error = _worker_exit(out)
    assert code == 2, out.stderr[-3000:]
    assert error.startswith("Read-only file system") and str(ckpts) in error
