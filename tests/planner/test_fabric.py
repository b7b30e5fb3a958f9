"""The fabric's cabling: rail-optimised (NIC k of every node on leaf k) or top-of-rack (all
of a node's NICs on one switch, flows past it hashed over the spine). One switch hop joins
`leaf_ports` nodes on rails and `leaf_ports / gpus_per_node` on a top-of-rack switch; past
it a ToR fabric's flows keep `ecmp_efficiency` of the link."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fm_pipeline.cli.plan import app
from fm_pipeline.config.spec import ClusterSpec
from fm_pipeline.planner.cluster import cluster_from_spec, make_cluster
from fm_pipeline.planner.collectives import LEAF, LINK_EFFICIENCY, SPINE, group_link
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.shape import named_shape
from fm_pipeline.planner.whatif import what_if

NIC = 50e9  # H100's 400 Gb/s NIC per GPU


def test_one_hop_joins_32_nodes_on_rails_and_4_on_a_top_of_rack_switch():
    rail, tor = make_cluster("h100"), make_cluster("h100", fabric="tor")
    assert (rail.gpus_per_leaf, tor.gpus_per_leaf) == (32 * 8, 4 * 8)
    # Data parallel, one member per node, over 16 nodes: one hop on rails, the spine on ToR.
    on_rails, on_tor = group_link(rail, 16, 8), group_link(tor, 16, 8)
    assert on_rails.level[()] == LEAF and on_tor.level[()] == SPINE
    assert on_rails.bw[()] == pytest.approx(NIC * LINK_EFFICIENCY)
    assert on_tor.bw[()] == pytest.approx(NIC * 0.7 * LINK_EFFICIENCY)
    # Inside one top-of-rack switch (4 nodes) nothing is hashed: the same link as rails.
    assert group_link(tor, 4, 8).bw[()] == pytest.approx(on_rails.bw[()])
    # Four GPUs a node: a 32-port ToR switch joins 8 nodes.
    assert make_cluster("h100", fabric="tor", gpus_per_node=4).gpus_per_leaf == 32


def test_a_tapered_spine_costs_a_top_of_rack_fabric_where_rails_stay_one_hop():
    rail = make_cluster("h100", oversubscription=2.0)
    tor = make_cluster("h100", oversubscription=2.0, fabric="tor")
    assert group_link(rail, 32, 8).bw[()] == pytest.approx(NIC * LINK_EFFICIENCY)
    assert group_link(tor, 32, 8).bw[()] == pytest.approx(NIC * 0.7 / 2 * LINK_EFFICIENCY)
    # Past 32 nodes rails reach the spine too, with its taper and no hashing loss.
    assert group_link(rail, 64, 8).bw[()] == pytest.approx(NIC / 2 * LINK_EFFICIENCY)


def test_the_default_fabric_keeps_a_non_blocking_spine_at_the_nic_rate():
    """What the calibration's published runs were predicted on: rails, 1:1, no hashing."""
    cluster = make_cluster("h100")
    assert (cluster.fabric, cluster.oversubscription, cluster.spine_share) == ("rail", 1.0, 1.0)
    assert group_link(cluster, 512, 8).bw[()] == pytest.approx(NIC * LINK_EFFICIENCY)


def test_bad_fabrics_name_the_field():
    with pytest.raises(PlanInputError, match="fabric: must be one of rail, tor"):
        make_cluster("h100", fabric="torus")
    with pytest.raises(PlanInputError, match=r"ecmp_efficiency: must be within \(0, 1\]"):
        make_cluster("h100", fabric="tor", ecmp_efficiency=1.5)
    with pytest.raises(PlanInputError, match="leaf_ports"):
        make_cluster("h100", leaf_ports=0)


def _estimate(*extra):
    args = ["estimate", "--model", "llama3-70b", "--seq-len", 8192, "--gpus", 1024,
            "--gpu-type", "h100", "--global-batch-tokens", 16 * 2**20, "--tp", 8, "--pp", 4,
            "--micro-batch", 1, "--json", *extra]
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_the_command_line_and_a_job_spec_give_the_same_top_of_rack_estimate():
    rail, tor = _estimate(), _estimate("--fabric", "tor")
    # 32 data-parallel replicas over 128 nodes: the gradient traffic leaves the ToR switch.
    assert tor["step_time_s"] > rail["step_time_s"] and tor["mfu"] < rail["mfu"]
    assert _estimate("--fabric", "tor", "--ecmp-efficiency", 1.0)["step_time_s"] < tor[
        "step_time_s"]
    spec = cluster_from_spec(ClusterSpec(accelerator="h100", fabric="tor", leaf_ports=32,
                                         ecmp_efficiency=0.7))
    assert spec == make_cluster("h100", fabric="tor")
    bad = CliRunner().invoke(app, ["estimate", "--model", "llama3-8b", "--gpus", "8",
                                   "--gpu-type", "h100", "--tp", "1", "--pp", "1",
                                   "--micro-batch", "1", "--fabric", "mesh"])
    assert bad.exit_code == 2 and "fabric: must be one of rail, tor" in bad.output


def test_what_if_prices_the_other_cabling():
    cluster = make_cluster("h100", storage_write_gbps=500)
    wi = what_if(named_shape("llama3-70b", seq_len=8192), cluster, gpus=1024,
                 global_batch_tokens=16 * 2**20, training_tokens=15e12, doublings=0,
                 layout=Layout(tp=8, pp=4, dp=32))
    rows = {r["scenario"]: r for r in wi.rows()}
    assert rows["tor fabric"]["step_time_s"] > rows["baseline"]["step_time_s"]
