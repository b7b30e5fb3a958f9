"""A manifest whose checksums match but whose topology lies is refused: `fm ckpt validate`
holds the manifest's world, layout, step and data cursor against what the ranks saved
(one RNG state per rank, the data files' ranks, train_state.topology, the loader state),
so a drill can no longer report a world change that never happened."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from fm_pipeline.catalog import CheckpointRef, validate

pytestmark = pytest.mark.slow


def _copy(layouts_run, tmp_path, job: str, step: int):
    where = tmp_path / job / f"step-{step:08d}"
    shutil.copytree(layouts_run.checkpoint(job, step), where)
    return where


def _lie(where, **parallelism) -> None:
    path = where / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["parallelism"].update(parallelism)
    path.write_text(json.dumps(manifest))


def test_the_real_checkpoint_passes_and_a_lying_world_is_named(layouts_run, tmp_path):
    honest = _copy(layouts_run, tmp_path, "fsdp4", 2)
    assert validate(CheckpointRef.local(honest)) == []

    # fsdp4 saved at world 4; the manifest now claims 2 ranks of dp_shard 2.
    _lie(honest, world_size=2, nproc_per_node=2, dp_shard=2,
         mesh={"dim_names": ["dp_replicate", "dp_shard", "pp", "tp"], "shape": [1, 2, 1, 1]})
    found = "\n".join(str(p) for p in validate(CheckpointRef.local(honest)))
    assert ("manifest.json parallelism.world_size: the manifest says world_size 2, but the "
            "checkpoint holds the RNG states of ranks 0-3 (a world of 4)") in found
    assert "but rank 3 wrote .metadata's data files" in found
    assert "manifest.json parallelism: says 'world2:" in found
    assert "train_state.topology = 'world4:" in found


def test_a_lying_layout_and_cursor_are_named_by_fm_ckpt_validate(layouts_run, tmp_path):
    from fm_pipeline.cli.main import app

    where = _copy(layouts_run, tmp_path, "fsdp4", 2)
    # Same world, another layout (dp_replicate 2 x dp_shard 2), and a cursor moved ahead.
    _lie(where, dp_replicate=2, dp_shard=2,
         mesh={"dim_names": ["dp_replicate", "dp_shard", "pp", "tp"], "shape": [2, 2, 1, 1]})
    manifest = json.loads((where / "manifest.json").read_text())
    manifest["data"]["cursor"]["samples_consumed"] += 8
    (where / "manifest.json").write_text(json.dumps(manifest))
    job = layouts_run.jobs / "fsdp4.yaml"
    out = CliRunner().invoke(app, ["ckpt", "validate", str(where), "--job", str(job)])
    assert out.exit_code == 1, out.output
    assert "parallelism: says" in out.output and "dp_replicate2" in out.output
    assert "data.cursor.samples_consumed" in out.output
