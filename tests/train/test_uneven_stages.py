"""Uneven pipeline stages (parallelism.pp_layers_per_stage): 6 layers over 4 stages as
1-2-2-1 train the model the same 6-layer model trains under FSDP (the layouts launch runs
both), and its checkpoint resumes on an even 2-stage split and on plain FSDP, each going on
along the reference's loss curve. Parameters keep their global names in every stage, so
the checkpoint reshards between any two splits."""

from __future__ import annotations

import pytest

from fm_pipeline.data.testing import small_job
from tests.train.launch import BASE, failure, train, write_job

pytestmark = pytest.mark.slow
REFERENCE, UNEVEN = "fsdp4-6l", "pp4-uneven"
TOLERANCE = 1e-4  # fp32 reductions in another order, as tests/train/test_resume.py


def _losses(ws, job: str) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in ws.metrics(job)}


def test_a_1_2_2_1_split_trains_what_fsdp_trains(layouts_run):
    reference, uneven = _losses(layouts_run, REFERENCE), _losses(layouts_run, UNEVEN)
    assert sorted(uneven) == list(range(1, 9))
    for step, loss in uneven.items():
        assert loss == pytest.approx(reference[step], abs=TOLERANCE), (step, uneven)
    assert uneven[1] - uneven[8] > 0.5  # and it learns


@pytest.mark.parametrize("name,layout", [
    ("even2-from-uneven", {"parallelism.pp": 2, "parallelism.dp_shard": 1}),
    ("fsdp2-from-uneven", {"parallelism.dp_shard": 2}),
])
def test_the_uneven_checkpoint_resumes_on_another_split(layouts_run, name, layout):
    ws = layouts_run
    job = write_job(ws.jobs, name, nproc=2, **{"model.n_layers": 6, **layout})
    out = train(ws.home, job, "--resume-from", str(ws.checkpoint(UNEVEN, 4)),
                "--end-step", "8", nproc=2)
    assert out.returncode == 0, failure(out)
    (segment,) = ws.segments(name)
    assert (segment["start_step"], segment["resharded"]) == (4, True)
    reference, resumed = _losses(ws, REFERENCE), _losses(ws, name)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=TOLERANCE), (step, resumed)


def test_a_split_that_does_not_add_up_is_refused_by_name():
    from fm_pipeline.config import JobSpecError

    with pytest.raises(JobSpecError, match="pp_layers_per_stage") as e:
        small_job(**{**BASE, "parallelism.nproc_per_node": 4, "model.n_layers": 6,
                     "parallelism.pp": 4, "parallelism.dp_shard": 1,
                     "parallelism.pp_layers_per_stage": [1, 2, 2, 2]})
    assert "6 (model n_layers) in all" in str(e.value)
    with pytest.raises(JobSpecError, match="or give parallelism.pp_layers_per_stage"):
        small_job(**{**BASE, "parallelism.nproc_per_node": 4, "model.n_layers": 6,
                     "parallelism.pp": 4, "parallelism.dp_shard": 1})


def test_the_split_is_part_of_the_recorded_topology():
    """A checkpoint's manifest and train state name the split: a resume on another split
    of the same degrees is a resharded one, and says so."""
    from fm_pipeline.catalog.topology import layout_key
    from fm_pipeline.checkpoint.commit import parallelism_info

    def job(split):
        return small_job(**{**BASE, "parallelism.nproc_per_node": 4, "model.n_layers": 6,
                            "parallelism.pp": 4, "parallelism.dp_shard": 1,
                            "parallelism.pp_layers_per_stage": split})

    uneven, other = job([1, 2, 2, 1]), job([2, 1, 1, 2])
    info = parallelism_info(uneven, world_size=4)
    assert info.pp_layers_per_stage == [1, 2, 2, 1]
    assert "pp_layers1-2-2-1" in layout_key(info, world_size=4, dp_shard=1)
    assert layout_key(info, world_size=4, dp_shard=1) != layout_key(
        other.parallelism, world_size=4, dp_shard=1)
