"""Mesh arithmetic and the job-spec rules that keep impossible layouts from launching."""

from __future__ import annotations

import pytest
import torch

from fm_pipeline.config import JobSpecError
from fm_pipeline.data.testing import small_job
from fm_pipeline.parallel import MESH_DIMS, ParallelDims


def test_rank_coordinates_follow_the_device_mesh_layout():
    dims = ParallelDims(dp_replicate=2, dp_shard=2, pp=2, tp=2, world_size=16)
    mesh = torch.arange(16).view(dims.shape)  # how init_device_mesh lays out ranks
    for rank in range(16):
        coords = dims.coordinates(rank)
        assert mesh[tuple(coords[d] for d in MESH_DIMS)].item() == rank
    # tp peers and pipeline stages of one data-parallel rank read the same batch
    assert {dims.dp_rank(r) for r in range(4)} == {0}
    assert sorted({dims.dp_rank(r) for r in range(16)}) == [0, 1, 2, 3]


def test_a_world_that_does_not_match_the_degrees_names_every_degree():
    with pytest.raises(ValueError) as e:
        ParallelDims(dp_replicate=1, dp_shard=2, pp=2, tp=2, world_size=4)
    assert "dp_replicate 1 x dp_shard 2 x pp 2 x tp 2 = 8" in str(e.value)
    assert "world size 4" in str(e.value)


@pytest.mark.parametrize("overrides, field, words", [
    ({"parallelism.dp_shard": 2, "parallelism.tp": 2}, "parallelism",
     ["dp_shard 2", "tp 2", "= 4", "world size 2"]),
    ({"parallelism.pp": 2, "model.tie_embeddings": True}, "parallelism.pp",
     ["pp 2", "tie_embeddings"]),
    ({"parallelism.tp": 2, "model.tie_embeddings": True}, "parallelism.tp",
     ["tp 2", "tie_embeddings"]),
    ({"parallelism.pp": 2, "parallelism.pp_schedule": "Interleaved1F1B",
      "parallelism.pp_virtual_stages": 4}, "parallelism.pp",
     ["n_layers (4)", "pp x pp_virtual_stages", "2 x 4 = 8"]),
    ({"parallelism.tp": 2, "training.compile": True}, "training.compile",
     ["parallelism.tp 2", "training.compile: false"]),
    # Expert parallelism: experts split evenly, ep within dp_shard, and a model with experts.
    ({"model.size": "moe-debug", "parallelism.ep": 3, "parallelism.nproc_per_node": 3},
     "parallelism.ep", ["n_experts (8)", "parallelism.ep (3)"]),
    ({"model.size": "moe-debug", "parallelism.ep": 4}, "parallelism",
     ["ep 4", "dp_shard 2"]),
    ({"parallelism.ep": 2}, "parallelism.ep", ["ep 2", "Mixture of Experts", "dense"]),
])
def test_impossible_layouts_are_refused_before_launch(overrides, field, words):
    with pytest.raises(JobSpecError) as e:
        small_job(**{"parallelism.nproc_per_node": 2, **overrides})
    fields = [f for f, _ in e.value.problems]
    assert field in fields, e.value.problems
    message = " ".join(m for _, m in e.value.problems)
    for word in words:
        assert word in message, (word, message)


def test_expert_parallel_mesh_keeps_every_rank_where_it_was():
    """ep is carved out of dp_shard: same coordinates, same data-parallel rank per rank."""
    plain = ParallelDims(dp_replicate=2, dp_shard=4, pp=1, tp=2, world_size=16)
    ep = ParallelDims(dp_replicate=2, dp_shard=4, pp=1, tp=2, world_size=16, ep=2)
    assert [ep.dp_rank(r) for r in range(16)] == [plain.dp_rank(r) for r in range(16)]
    assert "ep 2 within dp_shard" in ep.describe()
    with pytest.raises(ValueError, match="ep 3 must divide dp_shard 4"):
        ParallelDims(dp_replicate=1, dp_shard=4, pp=1, tp=1, world_size=4, ep=3)
