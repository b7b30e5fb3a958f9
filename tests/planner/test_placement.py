"""Rank placement: TP inside a node, pipeline stages as neighbours, data parallel outermost."""

from __future__ import annotations

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.placement import placement, rank_coordinates, rank_table

CLUSTER = make_cluster("h100", nodes_per_rack=4, region_gpus=1024)


def test_tp_groups_are_consecutive_gpus_of_one_node():
    lay = Layout(tp=8, pp=4, dp=8)
    coords = rank_coordinates(lay)
    assert list(coords["tp"][:8]) == list(range(8))
    assert len(set(coords["pp"][:8])) == 1 and len(set(coords["dp"][:8])) == 1
    rows = rank_table(CLUSTER, lay, limit=16)
    assert {r["node"] for r in rows[:8]} == {0} and rows[8]["pp"] == 1  # next stage, next node


def test_a_pipeline_that_fits_under_a_leaf_stays_under_it():
    p = placement(CLUSTER, Layout(tp=8, pp=4, dp=16))  # 32 GPUs a pipeline; a rail leaf joins 256
    assert p.tp_inside_node and p.pipeline_inside_leaf and not p.crosses_regions
    reach = {g.name: g.reaches for g in p.groups}
    assert reach == {"tp": "node", "cp": "none", "pp": "leaf", "dp": "cluster"}


def test_plans_larger_than_a_region_flag_the_collectives_that_cross():
    p = placement(CLUSTER, Layout(tp=8, pp=4, dp=64))  # 2048 GPUs, regions of 1024
    assert p.crosses_regions == ["dp"]
    assert any("cross regions" in n for n in p.notes)
    wide = placement(CLUSTER, Layout(tp=16, pp=64, dp=2))  # a 1024-GPU pipeline, TP over 2 nodes
    assert not wide.tp_inside_node and not wide.pipeline_inside_leaf
    assert any("does not fit in a node" in n for n in wide.notes)
