"""`fm ckpt`: what an operator sees for good, corrupt and missing checkpoints."""

from __future__ import annotations

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tests.local_site import local_root
from fm_pipeline.checkpoint import CheckpointManager
from fm_pipeline.cli.ckpt import app
from fm_pipeline.config import dump_job
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site

runner = CliRunner()


@pytest.fixture
def job_file(tmp_path):
    job = tiny_job(keep_last=2)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(dump_job(job)))
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(job, trainer.app_state, async_save=False, site=local_site.site())
    for step in (1, 2):
        trainer.step(step)
        manager.save(step, tokens_seen=32 * step)
    manager.close()
    return str(path)


def test_list_validate_export_retain(job_file, tmp_path):
    out = runner.invoke(app, ["list", "--job", job_file], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert out.output.count("valid") == 2 and "world 1 (single process)" in out.output

    shard = local_root("ckpt-test") / "step-00000002" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    out = runner.invoke(app, ["validate", "2", "--job", job_file], terminal_width=200)
    assert out.exit_code == 1
    assert "__0_0.distcp: size" in out.output and "truncated" in out.output
    out = runner.invoke(app, ["validate", "--job", job_file], terminal_width=200)
    assert out.exit_code == 0
    assert "skipped" in out.output and "(step 1)" in out.output

    pt = tmp_path / "model.pt"
    out = runner.invoke(app, ["export", "1", str(pt), "--job", job_file])
    assert out.exit_code == 0, out.output
    assert "model" in torch.load(pt, weights_only=False)

    out = runner.invoke(app, ["retain", "--job", job_file, "--tier", "local", "--dry-run"],
                        terminal_width=200)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())  # rich wraps long lines
    # The truncated step 2 counts as nothing and would be set aside, not kept as last-k.
    assert "kept 1 (last-k/newest-valid); would delete nothing" in text
    assert "would set aside as invalid 2" in text


def test_unknown_checkpoint_is_one_red_line(job_file):
    out = runner.invoke(app, ["validate", "77", "--job", job_file], terminal_width=200)
    assert out.exit_code == 2
    assert "no checkpoint '77'" in out.output
