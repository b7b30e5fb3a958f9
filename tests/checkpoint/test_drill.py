"""The restore drill restores fm_pipeline's Transformer on another topology (written by one
process, restored by two FSDP ranks) and passes; a tampered checkpoint fails, saying why."""

from __future__ import annotations

import json
import shutil

import pytest
import torch.distributed as dist

from fm_pipeline.catalog import CheckpointRef, apply_retention, read_marks
from tests.local_site import local_root
from fm_pipeline.catalog.manifest import Manifest
from fm_pipeline.checkpoint import drill_worker
from fm_pipeline.checkpoint.drill import drill_latest, run_restore_drill
from tests.checkpoint.transformer_ckpt import drill_job, write_checkpoint
from tests.conftest import free_port
from tests import local_site


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("drill-src")
    return root, write_checkpoint(root=root)


@pytest.fixture
def ref(written) -> CheckpointRef:
    """A fresh copy of the step-2 checkpoint in this test's local tier."""
    root, saved = written
    dest = local_root(drill_job().name)
    shutil.copytree(root, dest)
    return CheckpointRef.local(dest / "step-00000002")


@pytest.fixture
def world_of_one_env(monkeypatch):
    """The environment torchrun would give a single worker, so drill_worker.run runs here."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.slow
def test_drill_passes_on_a_good_checkpoint_and_is_recorded(ref, written):
    result = run_restore_drill(ref, site=local_site.site())
    assert result.passed, result.summary() + json.dumps(result.checks, indent=1)[-3000:]
    assert result.source_topology == "world 1 (single process)"
    assert result.drill_topology == "world 2 (dp_shard 2)" and result.world_size == 2
    checks = result.checks
    assert checks["params"]["compared"] > 0 and checks["params"]["n_mismatched"] == 0
    assert checks["optimizer"]["compared"] > 0 and checks["optimizer"]["ok"]
    assert checks["loss"]["ok"] and checks["loss"]["expected"] == pytest.approx(
        checks["loss"]["restored"], rel=1e-4)
    assert checks["cursor"] == {"ok": True, "problems": [], "samples_consumed": 8}
    assert result.restore_s > 0 and result.bytes == written[1].total_bytes
    assert result.bytes_per_s == pytest.approx(result.bytes / result.restore_s)
    mark = read_marks(ref)["drill"]
    assert mark["passed"] is True and mark["drill_topology"] == result.drill_topology
    report = apply_retention(drill_job().name, keep_last=1, job=drill_job(), root=local_site.root_of(drill_job().name))
    assert "drill-passed" in report.kept[2]
    assert drill_latest(drill_job(), site=local_site.site()) is None  # the schedule does not drill it twice


def test_drill_fails_on_a_flipped_byte_naming_the_file(ref, world_of_one_env):
    shard = ref.dir / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = drill_worker.run(ref.dir, {"nproc_per_node": 1}, allow_same_topology=True)
    assert not result.passed
    (reason,) = result.reasons
    assert reason.startswith("checksums/model: __0_0.distcp: CRC32C mismatch")


def test_drill_fails_when_the_restored_loss_differs_from_the_recorded_one(ref, world_of_one_env):
    path = ref.dir / "manifest.json"  # the manifest claims another probe loss
    data = json.loads(path.read_text())
    data["probe"]["loss"] += 0.5
    path.write_text(json.dumps(Manifest.model_validate(data).model_dump()))
    result = drill_worker.run(ref.dir, {"nproc_per_node": 1}, allow_same_topology=True)
    assert not result.passed
    assert len(result.reasons) == 1 and result.reasons[0].startswith("loss: probe batch loss")
    assert result.checks["params"]["ok"] and result.checks["cursor"]["ok"]


def test_drill_refuses_a_truncated_checkpoint_before_launching_and_records_it(ref):
    shard = ref.dir / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(100)
    result = run_restore_drill(ref, site=local_site.site())
    assert not result.passed and result.world_size == 0  # no workers were started
    assert result.reasons[0].startswith("__0_0.distcp: size 100 bytes, the manifest says")
    assert read_marks(ref)["drill"]["passed"] is False


def test_drill_worker_refuses_the_source_topology(ref, world_of_one_env):
    with pytest.raises(ValueError, match="drill topology equals the source's"):
        drill_worker.run(ref.dir, {"nproc_per_node": 1})


def _with_parallelism(manifest, **degrees):
    spec = {**manifest.job_spec, "parallelism": {**manifest.job_spec["parallelism"], **degrees}}
    from fm_pipeline.config import parse_job

    job = parse_job(spec)
    par = manifest.parallelism.model_copy(update={
        **{k: getattr(job.parallelism, k) for k in ("nnodes", "nproc_per_node",
                                                     "dp_replicate", "dp_shard", "tp", "pp")},
        "world_size": job.parallelism.world_size})
    return manifest.model_copy(update={"parallelism": par, "job_spec": spec})


@pytest.mark.parametrize("source, expected", [
    ({"nproc_per_node": 2, "dp_shard": 1, "pp": 2}, {"nproc_per_node": 2, "tp": 1}),  # pp -> dp
    ({"nproc_per_node": 2, "dp_shard": 2}, {"nproc_per_node": 1}),                    # half
    ({"nproc_per_node": 1}, {"nproc_per_node": 2}),                                   # grow
])
def test_drill_topology_differs_from_the_source(ref, source, expected):
    from fm_pipeline.catalog import read_manifest
    from fm_pipeline.checkpoint.drill import choose_parallelism, drill_job, same_topology

    manifest = _with_parallelism(read_manifest(ref), **source)
    chosen = choose_parallelism(manifest)
    assert chosen == expected
    assert not same_topology(drill_job(manifest, chosen).parallelism, manifest.parallelism)


@pytest.mark.slow
def test_pipeline_checkpoint_drills_with_pp_swapped_for_dp():
    """Written by 2 pipeline stages (pp 2), restored by 2 FSDP ranks (dp_shard 2): every
    parameter and optimizer entry, the probe loss and the cursor check out."""
    import os
    import subprocess
    import sys

    from fm_pipeline.catalog import read_manifest
    from tests.conftest import REPO

    root = local_root(drill_job().name)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", "-m", "tests.checkpoint.transformer_ckpt",
                          str(root), "pp=2"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    ref = CheckpointRef.local(root / "step-00000002")
    assert read_manifest(ref).parallelism.pp == 2
    result = run_restore_drill(ref, site=local_site.site())
    assert result.passed, result.summary() + json.dumps(result.checks, indent=1)[-3000:]
    assert "pp 2" in result.source_topology and "pp" not in result.drill_topology
    assert result.drill_topology == "world 2 (dp_shard 2)"
    assert result.checks["params"]["n_mismatched"] == 0 and result.checks["optimizer"]["ok"]
    assert result.checks["loss"]["ok"] and result.checks["cursor"]["ok"]
