"""Held-out evaluation per data domain of a real checkpoint: a small job trained for a few
steps (`python -m fm_pipeline.train`, a world of one), then evaluated in fresh processes."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import yaml

from fm_pipeline.catalog import CheckpointInvalid, CheckpointRef, read_marks
from fm_pipeline.config import dump_job
from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.eval import evaluate_at_init, evaluate_checkpoint, evaluate_checkpoints
from fm_pipeline.storage import open_store
from tests.conftest import REPO
from tests import local_site

pytestmark = pytest.mark.slow
JOB = small_job(**{"name": "evaluated", "training.steps": 6, "training.segment_steps": 6,
                   "training.lr": 1e-2, "checkpoint.every_steps": 3,
                   "checkpoint.upload": False})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """FM_HOME with the small mix and JOB trained to step 6 (checkpoints at 3 and 6)."""
    home = tmp_path_factory.mktemp("eval")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FM_HOME", str(home))
        build_small_mix(JOB, store=open_store(str(home / "store")))
    spec = home / "job.yaml"
    spec.write_text(yaml.safe_dump(dump_job(JOB)))
    out = subprocess.run([sys.executable, "-m", "fm_pipeline.train", "--job", str(spec)],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "FM_HOME": str(home),
                              "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    return home


@pytest.fixture
def at_home(trained, monkeypatch):
    monkeypatch.setenv("FM_HOME", str(trained))
    return CheckpointRef.local(trained / "runs" / "evaluated" / "checkpoints" / "step-00000006")


def test_training_lowers_the_heldout_loss_of_every_domain_and_perplexity_is_exp_loss(at_home):
    trained = evaluate_checkpoint(at_home, job=JOB, max_batches=4, site=local_site.site())
    init = evaluate_at_init(JOB, max_batches=4, site=local_site.site())
    assert trained.step == 6 and init.step == 0
    assert set(trained.domains) == set(init.domains) == {"code", "prose"}
    for name, d in trained.domains.items():
        assert d.batches == 4 and d.tokens == 4 * JOB.training.micro_batch_size * \
            JOB.training.seq_len
        assert d.perplexity == pytest.approx(math.exp(d.loss))
        assert d.loss < init.domains[name].loss - 0.05, name
    mark = read_marks(at_home)["eval"]  # what the REST API lists as the evaluation
    assert mark["step"] == 6 and mark["domains"]["prose"]["loss"] == pytest.approx(
        trained.domains["prose"].loss)


def test_any_number_of_ranks_scores_the_same_checkpoint_alike(at_home):
    one = evaluate_checkpoint(at_home, job=JOB, max_batches=4, site=local_site.site())
    two = evaluate_checkpoint(at_home, job=JOB, max_batches=4, nproc=2, site=local_site.site())
    assert two.world_size == 2 and "dp_shard 2" in two.topology
    for name in one.domains:
        assert two.domains[name].batches == one.domains[name].batches
        assert two.domains[name].loss == pytest.approx(one.domains[name].loss, rel=1e-4)


def test_a_corrupted_checkpoint_is_refused_naming_the_file(at_home):
    shard = next(at_home.dir.glob("*.distcp"))
    original = shard.read_bytes()
    shard.write_bytes(original[:-8] + bytes(b ^ 0x5A for b in original[-8:]))
    try:
        with pytest.raises(CheckpointInvalid, match=shard.name):
            evaluate_checkpoint(at_home, job=JOB, max_batches=1, site=local_site.site())
    finally:
        shard.write_bytes(original)


def test_a_checkpoint_of_another_model_is_refused_before_anything_runs(at_home):
    other = small_job(**{"name": "evaluated", "model.dim": 128})
    with pytest.raises(CheckpointInvalid, match="model.config.dim"):
        evaluate_checkpoint(at_home, job=other, site=local_site.site())


def test_several_checkpoints_score_in_one_launch_as_each_alone(at_home, monkeypatch):
    """The evaluation run of a segment's checkpoints starts the workers once; each result
    (and its mark) is what evaluating that checkpoint alone gives. One corrupt checkpoint
    is named, the others are still scored and marked."""
    from fm_pipeline.eval import run

    earlier = CheckpointRef.local(at_home.dir.parent / "step-00000003")
    alone = [evaluate_checkpoint(r, job=JOB, max_batches=2, site=local_site.site()) for r in (earlier, at_home)]
    launches = []
    launch = run._launch
    monkeypatch.setattr(run, "_launch", lambda *a, **k: launches.append(a) or launch(*a, **k))
    both = evaluate_checkpoints([earlier, at_home], job=JOB, max_batches=2, site=local_site.site())
    assert len(launches) == 1 and [r.step for r in both] == [3, 6]
    for together, single in zip(both, alone, strict=True):
        for name, d in single.domains.items():
            assert together.domains[name].loss == pytest.approx(d.loss, rel=1e-5)
    assert both[0].domains["code"].loss > both[1].domains["code"].loss
    assert read_marks(earlier)["eval"]["step"] == 3

    shard = next(earlier.dir.glob("*.distcp"))
    original = shard.read_bytes()
    shard.write_bytes(original[:-8] + bytes(b ^ 0x5A for b in original[-8:]))
    (at_home.dir / "marks" / "eval.json").unlink()
    try:
        with pytest.raises(CheckpointInvalid, match=shard.name):
            evaluate_checkpoints([earlier, at_home], job=JOB, max_batches=2, site=local_site.site())
    finally:
        shard.write_bytes(original)
    assert read_marks(at_home)["eval"]["step"] == 6  # scored all the same
