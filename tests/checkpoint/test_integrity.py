"""A checkpoint is used only when whole and right: killed saves, flipped bytes, truncated or
missing files and another model's checkpoint are refused, naming the file or field, and
discovery falls back to the previous valid checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from fm_pipeline.catalog import CheckpointInvalid, CheckpointRef, latest_valid, validate
from tests.local_site import local_root
from fm_pipeline.checkpoint import CheckpointManager, restore, restore_latest
from fm_pipeline.checkpoint.load import NoRestorableCheckpoint
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests.conftest import REPO
from tests import local_site


def test_process_killed_mid_save_never_yields_a_selectable_checkpoint(tmp_path, fm_home):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "tests.checkpoint.kill_worker", str(ready)],
                            cwd=REPO, env={**os.environ, "FM_HOME": str(fm_home)})
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, "worker died before reaching the kill point"
            assert time.monotonic() < deadline, "worker never reached the kill point"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    job = tiny_job()
    killed = local_root(job.name) / "step-00000002"
    assert (killed / ".metadata").is_file() and list(killed.glob("*.distcp"))
    assert not (killed / "manifest.json").exists()
    found = latest_valid(job, root=local_site.root_of(job))
    assert found.found.step == 1
    (skipped, problems), = found.skipped
    assert skipped.step == 2
    assert [str(p) for p in problems] == [
        "manifest.json: missing: the save never committed (incomplete checkpoint)"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Two committed checkpoints (steps 1 and 2) of a tiny run, built once per module."""
    root = tmp_path_factory.mktemp("pristine")
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, root=root, async_save=False, site=local_site.site())
    for step in (1, 2):
        trainer.step(step)
        manager.save(step, tokens_seen=32 * step)
    manager.close()
    return root, {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture
def run_root(pristine):
    root = local_root(tiny_job().name)
    shutil.copytree(pristine[0], root)
    return root


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 7)


TAMPERING = {
    "flip_byte": (lambda d: _flip_byte(d / "__0_0.distcp"),
                  "__0_0.distcp: CRC32C mismatch"),
    "truncate": (lambda d: _truncate(d / "__0_0.distcp"),
                 "__0_0.distcp: size"),
    "remove": (lambda d: (d / "__0_0.distcp").unlink(),
               "__0_0.distcp: missing (the manifest lists"),
    "remove_metadata": (lambda d: (d / ".metadata").unlink(),
                        ".metadata: missing"),
    "extra_file": (lambda d: (d / "__1_0.distcp").write_bytes(b"stray"),
                   "__1_0.distcp: not listed in the manifest"),
    "bad_manifest": (lambda d: (d / "manifest.json").write_text('{"format": "fm-checkpoint/1"}'),
                     "manifest.json step: Field required"),
    "garbage_metadata": (lambda d: (d / ".metadata").write_bytes(b"\x80garbage"),
                         ".metadata: unreadable DCP metadata"),
}


@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_tampered_checkpoint_is_refused_naming_the_file_and_discovery_falls_back(run_root, kind):
    tamper, expected = TAMPERING[kind]
    tamper(run_root / "step-00000002")
    job = tiny_job()
    problems = [str(p) for p in validate(run_root / "step-00000002", job)]
    assert any(p.startswith(expected) for p in problems), problems
    assert validate(run_root / "step-00000001", job) == []
    found = latest_valid(job, root=local_site.root_of(job))
    assert found.found.step == 1
    assert found.skipped[0][0].step == 2


def test_restore_falls_back_to_the_previous_checkpoint_when_the_newest_is_corrupt(run_root):
    _flip_byte(run_root / "step-00000002" / "__0_0.distcp")
    trainer = Trainer(TinyLM())
    result = restore_latest(trainer.app_state, tiny_job(), root=local_site.root_of(tiny_job()))
    assert result.step == 1 and trainer.cursor.samples_consumed == 4
    assert "CRC32C mismatch" in result.skipped[0]


def test_a_newest_checkpoint_skipped_before_loading_is_logged_with_its_reason(run_root, caplog):
    # A truncated file fails the cheap listing check, not the load; the older checkpoint
    # restores, and the log still says which one was skipped and why.
    _truncate(run_root / "step-00000002" / "__0_0.distcp")
    with caplog.at_level("WARNING", logger="fm_pipeline.checkpoint.load"):
        result = restore_latest(Trainer(TinyLM()).app_state, tiny_job(), root=local_site.root_of(tiny_job()))
    assert result.step == 1
    said = [r.getMessage() for r in caplog.records if "step-00000002" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("skipping checkpoint")
    assert "__0_0.distcp: size" in said[0]


def test_another_models_checkpoint_is_refused_naming_the_field(run_root, pristine):
    other = tiny_job(dim=128)  # same job name, different architecture
    ref = CheckpointRef.local(run_root / "step-00000002")
    problems = [str(p) for p in validate(ref, other)]
    assert problems == ["manifest.json model.config.dim: checkpoint has 64, job 'ckpt-test' "
                        "has 128 (a checkpoint of another model)"]
    trainer = Trainer(TinyLM())
    with pytest.raises(CheckpointInvalid, match=r"model\.config\.dim"):
        restore(trainer.app_state, ref, job=other)
    assert latest_valid(other, root=local_site.root_of(other)).found is None
    result = restore(trainer.app_state, ref, job=tiny_job())
    assert result.step == 2
    assert all(torch.equal(v, pristine[1][k]) for k, v in trainer.model.state_dict().items())


def test_resume_refuses_to_start_over_when_no_committed_checkpoint_restores(run_root):
    for step in (1, 2):
        _flip_byte(run_root / f"step-0000000{step}" / "__0_0.distcp")
    trainer = Trainer(TinyLM())
    with pytest.raises(NoRestorableCheckpoint, match="none restores") as err:
        restore_latest(trainer.app_state, tiny_job(), root=local_site.root_of(tiny_job()))
    assert str(err.value).count("CRC32C mismatch") == 2


def test_resume_with_only_an_incomplete_save_is_a_fresh_start(run_root):
    for step in (1, 2):
        (run_root / f"step-0000000{step}" / "manifest.json").unlink()
    assert restore_latest(Trainer(TinyLM()).app_state, tiny_job(), root=local_site.root_of(tiny_job())) is None


def test_sha256_manifests_are_verified_the_same_way(tmp_path):
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=False,
                                checksum="sha256", site=local_site.site())
    trainer.step(1)
    ref = CheckpointRef.local(manager.save(1, tokens_seen=32).result().path)
    manager.close()
    from fm_pipeline.catalog import read_manifest

    entries = read_manifest(ref).files
    assert all(e.sha256 and e.crc32c is None for e in entries)
    assert validate(ref) == []
    _flip_byte(ref.dir / "__0_0.distcp")
    assert [p.where for p in validate(ref)] == ["__0_0.distcp"]
    assert "SHA-256 mismatch" in validate(ref)[0].message


def test_the_control_side_reads_dcp_metadata_as_torch_does_without_torch(pristine):
    """The validator's torch-free outline of `.metadata` (state keys, storage references)
    equals torch's own reading, and a full validation imports no torch."""
    from torch.distributed.checkpoint import FileSystemReader

    from fm_pipeline.catalog.dcp_outline import read_outline

    step = pristine[0] / "step-00000002"
    outline = read_outline((step / ".metadata").read_bytes())
    meta = FileSystemReader(str(step)).read_metadata()
    assert outline.state_keys == set(meta.state_dict_metadata)
    assert sorted(outline.storage) == sorted((str(i.relative_path), i.offset, i.length)
                                             for i in meta.storage_data.values())
    check = ("import sys; from fm_pipeline.catalog import validate; "
             f"assert validate({str(step)!r}) == []; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", check], cwd=REPO, check=True, timeout=60)


def test_a_metadata_pickle_that_would_run_code_is_refused_without_running_it(run_root,
                                                                             tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    import pickle

    (run_root / "step-00000002" / ".metadata").write_bytes(pickle.dumps(Payload()))
    problems = [str(p) for p in validate(run_root / "step-00000002", tiny_job())]
    assert any(p.startswith(".metadata: unreadable DCP metadata: refers to ")
               and "system, which DCP metadata never holds" in p for p in problems), problems
    assert not (tmp_path / "ran").exists()
    assert latest_valid(tiny_job(), root=local_site.root_of(tiny_job())).found.step == 1
