"""Step-time formulas: pipeline bubble, collectives on the network hierarchy, MFU/HFU."""

from __future__ import annotations

import numpy as np
import pytest

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.collectives import (
    LINK_EFFICIENCY,
    NODE,
    LEAF,
    REGION,
    SPINE,
    all_reduce_time,
    group_link,
    ring_pass_time,
)
from fm_pipeline.planner.layout import Candidates, Layout
from fm_pipeline.planner.shape import named_shape
from fm_pipeline.planner.step import evaluate

H100 = make_cluster("h100")  # 8 GPUs per node, 450 GB/s NVLink, 50 GB/s per-GPU NIC, 4 nodes/rack
SHAPE = named_shape("llama3-70b", seq_len=4096)


def run(*layouts, batch_tokens=256 * 4096, cluster=H100):
    return evaluate(SHAPE, cluster, Candidates.from_layouts(list(layouts)),
                    global_batch_tokens=batch_tokens)


@pytest.mark.parametrize("pp,v", [(4, 1), (8, 1), (4, 2), (8, 4)])
def test_pipeline_bubble_is_p_minus_1_over_v_m_plus_p_minus_1(pp, v):
    ev = run(Layout(tp=8, pp=pp, dp=4, virtual_stages=v))
    m = 256 // 4
    pipeline = ev.step_time_s - ev.dp_comm_s - ev.optimizer_s
    assert ev.bubble_s[0] / pipeline[0] == pytest.approx((pp - 1) / (v * m + pp - 1))


def test_more_micro_batches_shrink_the_bubble():
    small, large = (run(Layout(tp=8, pp=8, dp=4), batch_tokens=b) for b in (32 * 4096, 512 * 4096))
    assert small.fraction(small.bubble_s)[0] > 3 * large.fraction(large.bubble_s)[0]


def test_ring_collective_inside_a_node_uses_nvlink():
    link = group_link(H100, 8, 1)
    assert link.level[()] == NODE
    nbytes = 1e9
    expected = 7 / 8 * nbytes / (450e9 * LINK_EFFICIENCY)
    assert ring_pass_time(nbytes, 8, link) == pytest.approx(expected, rel=0.01)  # + latency
    assert all_reduce_time(nbytes, 8, link) == pytest.approx(2 * expected, rel=0.01)


def test_groups_that_leave_the_node_use_k_rails_then_the_spine():
    per_node_8 = group_link(H100, 16, 1)  # 2 nodes x 8 members: 8 rails of 50 GB/s
    one_per_node = group_link(H100, 4, 8)  # 1 member per node, 4 nodes under one rail leaf
    spine = group_link(make_cluster("h100", oversubscription=2.0), 64, 8)  # 64 nodes > a leaf's 32
    assert per_node_8.level[()] == LEAF and one_per_node.level[()] == LEAF
    assert per_node_8.bw[()] == pytest.approx(400e9 * LINK_EFFICIENCY)
    assert one_per_node.bw[()] == pytest.approx(50e9 * LINK_EFFICIENCY)
    assert spine.level[()] == SPINE and spine.bw[()] == pytest.approx(25e9 * LINK_EFFICIENCY)
    region = group_link(make_cluster("h100", region_gpus=1024, inter_region_gbps=5), 256, 8)
    assert region.level[()] == REGION and region.bw[()] == pytest.approx(5e9 * LINK_EFFICIENCY)


def test_tensor_parallelism_across_nodes_costs_more_than_inside_nvlink():
    ev = run(Layout(tp=8, pp=4, dp=4), Layout(tp=16, pp=2, dp=4))
    assert list(ev.tp_level) == [NODE, LEAF]
    per_layer = ev.tp_comm_s / ev.memory.layers_per_rank
    assert per_layer[1] > per_layer[0]


def test_mfu_is_model_flops_over_time_and_peak_and_hfu_adds_recomputation():
    ev = run(Layout(tp=8, pp=4, dp=4, recompute="none"), Layout(tp=8, pp=4, dp=4, recompute="full"))
    flops = SHAPE.model_flops_per_token() * 256 * 4096
    assert ev.mfu * ev.step_time_s * 128 * 989e12 == pytest.approx([flops, flops])
    assert ev.hfu[0] == pytest.approx(ev.mfu[0])
    recompute = (
        2 * SHAPE.layers * SHAPE.layer_matmul_weights() + 4 * SHAPE.layers * SHAPE.hidden * 4096
    )
    assert ev.hfu[1] / ev.mfu[1] == pytest.approx(1 + recompute / SHAPE.model_flops_per_token())
    assert ev.step_time_s[1] > ev.step_time_s[0]  # recomputation costs time


def test_step_time_parts_add_up():
    ev = run(Layout(tp=4, pp=4, dp=4, cp=2, virtual_stages=2, sharding="fsdp"))
    parts = (
        ev.compute_s
        + ev.tp_comm_s
        + ev.cp_comm_s
        + ev.pp_comm_s
        + ev.dp_comm_s
        + ev.bubble_s
        + ev.optimizer_s
    )
    assert parts == pytest.approx(ev.step_time_s)
    assert np.all(ev.cp_comm_s > 0)


def test_slower_fabric_exposes_more_data_parallel_communication():
    lay = Layout(tp=8, pp=1, dp=16, sharding="fsdp")
    fast = run(lay)
    slow = run(lay, cluster=make_cluster("h100", inter_node_gbps=5))
    assert slow.dp_comm_s[0] > fast.dp_comm_s[0]
    assert slow.mfu[0] < fast.mfu[0]


def test_context_parallel_ranks_reduce_their_gradients_even_without_dp():
    ev = run(Layout(tp=8, cp=2, dp=1), Layout(tp=8, cp=1, dp=1), batch_tokens=16 * 4096)
    assert ev.dp_comm_s[0] > 0 and ev.dp_comm_s[1] == 0


def test_fsdp_under_a_pipeline_gathers_and_reduces_once_per_step_as_the_trainer_runs_it():
    # torch.distributed.pipelining keeps an FSDP stage unsharded through the step and syncs
    # gradients at the last backward only; without a pipeline FSDP re-gathers and reduces
    # every micro-batch of the gradient accumulation.
    def dp_comm(pp, sharding, batch_tokens):
        lay = Layout(tp=8, pp=pp, dp=8, sharding=sharding)
        ev = evaluate(SHAPE, H100, Candidates.from_layouts([lay]),
                      global_batch_tokens=batch_tokens, dp_overlap=False)
        return float(ev.dp_comm_s[0]), ev.memory

    small, big = 32 * 4096, 128 * 4096  # 4 and 16 micro-batches per step
    fsdp_pp, mem_pp = dp_comm(4, "fsdp", big)
    zero1_pp, mem_zero1 = dp_comm(4, "zero1", big)
    assert fsdp_pp == pytest.approx(zero1_pp)
    assert dp_comm(4, "fsdp", small)[0] == pytest.approx(fsdp_pp)
    assert dp_comm(1, "fsdp", big)[0] > 3 * dp_comm(1, "fsdp", small)[0]
    # ... and holds what it gathered: full bf16 weights and fp32 gradients, sharded optimizer.
    _, mem_ddp = dp_comm(4, "ddp", big)
    assert mem_pp.weights[0] == pytest.approx(mem_ddp.weights[0])
    assert mem_pp.grads[0] == pytest.approx(mem_ddp.grads[0])
    assert mem_pp.optimizer[0] == pytest.approx(mem_zero1.optimizer[0])
    _, mem_flat = dp_comm(1, "fsdp", big)
    assert mem_flat.grads[0] == pytest.approx(dp_comm(1, "ddp", big)[1].grads[0] / 8)
