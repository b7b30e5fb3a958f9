"""Collective and point-to-point times on the cluster's network hierarchy (alpha-beta model).

A group of `size` ranks placed every `stride` ranks (ranks fill a node, then the next:
tp innermost, then cp, pp, dp) spans `size x stride` consecutive ranks. Its bandwidth per
GPU is NVLink when that span fits in a node. Otherwise the ring crosses nodes: with k group
members per node, NCCL runs k rings over k rail NICs, so the bus bandwidth is
min(NVLink, k x NIC), where the NIC rate is the leaf's (one switch hop: how many nodes that
joins depends on the fabric's cabling, planner.cluster), the spine's (divided by the
oversubscription, and by ECMP's collisions on a top-of-rack fabric) or the inter-region
rate, whichever level the span reaches.

Ring all-gather / reduce-scatter of a `bytes_full` tensor: (n-1)/n x bytes / bandwidth plus
the ring's latency, one step per rank as NCCL models it (src/graph/tuning.cc: baseLat +
(nRanks - nNodes) x intraLat + (nNodes - 1) x interLat): n - nodes NVLink steps and
nodes - 1 network steps, so a ring over 4,096 ranks pays ~15 ms a call in latency alone.
All-reduce moves twice the bytes; its latency is the better of two rings and NCCL's tree (2 log2(nodes)
inter-node hops), which is what keeps all-reduce usable on thousands of nodes while
ring-based all-gather / reduce-scatter over thousands of ranks pays milliseconds per call.
All-to-all (expert parallelism's token dispatch and combine) of `bytes` per rank: each rank
keeps 1/n and sends the rest; what stays in the node moves over NVLink, what leaves it over
the rank's NIC, concurrently, so the slower of the two sets the time; NCCL posts all n - 1
sends at once, so the latency is one far hop plus a per-peer cost.
Everything is vectorized over numpy arrays of group sizes and strides.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from fm_pipeline.planner.cluster import ClusterConfig

GB = 1e9
LINK_EFFICIENCY = 0.8  # achieved bus bandwidth / link rate (nccl-tests on NVLink and InfiniBand)
ALPHA_INTRA_S = 3e-6  # per hop inside a node (NCCL's ring/simple NVLink step: 3.4 us)
ALPHA_INTER_S = 10e-6  # per hop across the fabric (NCCL's ring/simple network step: 9.6 us)
ALPHA_REGION_S = 1e-3  # per hop between regions (metro distance round trips)

NODE, LEAF, SPINE, REGION = 0, 1, 2, 3
LEVEL_NAMES = ("node", "leaf", "cluster", "cross-region")


@dataclass
class Link:
    bw: np.ndarray  # bytes/s per GPU, efficiency applied
    alpha_s: np.ndarray  # total latency of one ring pass
    tree_alpha_s: np.ndarray  # total latency of a tree all-reduce
    level: np.ndarray  # NODE .. REGION: the farthest level the group reaches
    p2p_bw: np.ndarray  # bytes/s of one GPU's point-to-point send to its group neighbour
    p2p_alpha_s: np.ndarray


def span_level(cluster: ClusterConfig, span: np.ndarray) -> np.ndarray:
    """Farthest level of the hierarchy that `span` consecutive ranks reach."""
    span = np.asarray(span)
    level = np.where(span <= cluster.gpus_per_node, NODE,
                     np.where(span <= cluster.gpus_per_leaf, LEAF, SPINE))
    if cluster.region_gpus:
        level = np.where(span > cluster.region_gpus, REGION, level)
    return level


def group_link(cluster: ClusterConfig, size, stride, *, span=None, per_node=None) -> Link:
    """The link of groups of `size` ranks every `stride` ranks. A group that is not one
    strided run (data parallel x context parallel) passes its `span` and `per_node`.

    Thirty thousand candidate layouts have a few hundred distinct groups: each distinct
    (size, stride, span, per_node) is worked out once and the answers spread back."""
    size, stride = np.asarray(size, dtype=np.float64), np.asarray(stride, dtype=np.float64)
    columns = np.broadcast_arrays(size, stride, size * stride if span is None else span,
                                  -1.0 if per_node is None else per_node)
    if columns[0].ndim != 1 or len(columns[0]) < 64:
        return _group_link(cluster, size, stride, span=span, per_node=per_node)
    code = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:  # one integer per distinct row (a 1-D unique per column is cheap)
        values, index = np.unique(column, return_inverse=True)
        code = code * len(values) + index.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    size, stride, span_, per_node_ = (column[first] for column in columns)
    link = _group_link(cluster, size, stride, span=span_,
                       per_node=None if per_node is None else per_node_)
    return Link(**{f.name: getattr(link, f.name)[inverse.reshape(-1)] for f in fields(Link)})


def _group_link(cluster: ClusterConfig, size, stride, *, span=None, per_node=None) -> Link:
    size = np.asarray(size, dtype=np.float64)
    stride = np.asarray(stride, dtype=np.float64)
    gpn = cluster.gpus_per_node
    level = span_level(cluster, size * stride if span is None else span)
    if per_node is None:
        per_node = np.clip(np.floor(gpn / stride), 1, size)  # group members sharing a node
    intra = cluster.intra_node_gbps * GB
    nic = np.select(
        [level == LEAF, level == SPINE, level == REGION],
        [
            cluster.inter_node_gbps * GB,
            cluster.inter_node_gbps * GB * cluster.spine_share,
            np.minimum(cluster.inter_region_gbps, cluster.inter_node_gbps * cluster.spine_share)
            * GB,
        ],
        default=intra,
    )
    crossing = level > NODE
    bw = np.where(crossing, np.minimum(intra, per_node * nic), intra) * LINK_EFFICIENCY
    nodes = np.maximum(size / per_node, 1)
    alpha_far = np.where(level == REGION, ALPHA_REGION_S, ALPHA_INTER_S)
    intra_hops = (per_node - 1) * ALPHA_INTRA_S
    # A ring's chunk passes every rank: size - nodes NVLink steps and nodes - 1 network ones
    # (NCCL's own tuning model, src/graph/tuning.cc); a tree climbs one node's chain.
    ring_intra = np.maximum(size - nodes, 0) * ALPHA_INTRA_S
    alpha = np.where(crossing, ring_intra + (nodes - 1) * alpha_far, (size - 1) * ALPHA_INTRA_S)
    tree = np.where(crossing, 2 * intra_hops + 2 * np.ceil(np.log2(nodes)) * alpha_far, 2 * alpha)
    p2p_bw = np.where(crossing, nic, intra) * LINK_EFFICIENCY
    p2p_alpha = np.where(crossing, alpha_far, ALPHA_INTRA_S)
    return Link(
        bw=bw,
        alpha_s=alpha,
        tree_alpha_s=np.minimum(tree, 2 * alpha),
        level=level,
        p2p_bw=p2p_bw,
        p2p_alpha_s=p2p_alpha,
    )


def ring_pass_time(bytes_full, size, link: Link, *, calls=1) -> np.ndarray:
    """All-gathers or reduce-scatters moving `bytes_full` (gathered size) in `calls` pieces."""
    size = np.asarray(size, dtype=np.float64)
    t = (size - 1) / np.maximum(size, 1) * np.asarray(bytes_full) / link.bw + calls * link.alpha_s
    return np.where(size > 1, t, 0.0)


def all_reduce_time(bytes_full, size, link: Link, *, calls=1) -> np.ndarray:
    size = np.asarray(size, dtype=np.float64)
    t = (
        2 * (size - 1) / np.maximum(size, 1) * np.asarray(bytes_full) / link.bw
        + calls * link.tree_alpha_s
    )
    return np.where(size > 1, t, 0.0)


def p2p_time(nbytes, link: Link, *, active) -> np.ndarray:
    return np.where(active, np.asarray(nbytes) / link.p2p_bw + link.p2p_alpha_s, 0.0)


def all_to_all_time(nbytes, size, link: Link, *, per_node, intra_gbps: float,
                    outside_bytes=None) -> np.ndarray:
    """One all-to-all moving `nbytes` out of each of `size` ranks, `per_node` of them in a
    node (the rest are reached through the NIC at link.p2p_bw). `outside_bytes`: what leaves
    the node when the dispatch sends less than that share (once per node, node-limited)."""
    size = np.asarray(size, dtype=np.float64)
    per_node = np.minimum(np.asarray(per_node, dtype=np.float64), size)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    inside = (per_node - 1) / size * nbytes / (intra_gbps * GB * LINK_EFFICIENCY)
    if outside_bytes is None:
        outside_bytes = (size - per_node) / size * nbytes
    outside = np.asarray(outside_bytes, dtype=np.float64) / link.p2p_bw
    t = np.maximum(inside, outside) + link.p2p_alpha_s + (size - 1) * ALPHA_INTRA_S
    return np.where(size > 1, t, 0.0)
