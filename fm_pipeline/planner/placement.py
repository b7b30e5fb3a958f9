"""Rank placement: which GPU runs which (dp, pp, cp, tp) coordinate, and what each group's
traffic crosses.

Ranks fill a node, then the next node, then the next rack. The mesh is laid out innermost
first tp, cp, pp, dp (the job spec's mesh order, dp outermost), so a TP group is consecutive
GPUs (inside a node whenever tp <= GPUs per node), a pipeline's stages are neighbours
(one switch hop apart whenever tp x cp x pp fits under a leaf), and only data-parallel
traffic reaches across the spine, and across regions when the job outgrows one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.collectives import LEAF, LEVEL_NAMES, NODE, REGION, span_level
from fm_pipeline.planner.layout import Layout


@dataclass(frozen=True)
class GroupPlacement:
    name: str
    size: int
    stride: int
    span_gpus: int  # consecutive ranks one group covers
    reaches: str  # node, leaf, cluster or cross-region


@dataclass
class Placement:
    nodes: int
    racks: int
    groups: list[GroupPlacement]
    tp_inside_node: bool
    pipeline_inside_leaf: bool
    crosses_regions: list[str]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _group(cluster: ClusterConfig, name: str, size: int, stride: int) -> GroupPlacement:
    span = size * stride
    level = int(span_level(cluster, np.asarray(span))) if size > 1 else NODE
    return GroupPlacement(name=name, size=size, stride=stride, span_gpus=span,
                          reaches=LEVEL_NAMES[level] if size > 1 else "none")


def placement(cluster: ClusterConfig, layout: Layout) -> Placement:
    gpus = layout.gpus
    nodes = -(-gpus // cluster.gpus_per_node)
    racks = -(-nodes // cluster.nodes_per_rack)
    tp, cp, pp, dp = layout.tp, layout.cp, layout.pp, layout.dp
    groups = [
        _group(cluster, "tp", tp, 1),
        _group(cluster, "cp", cp, tp),
        _group(cluster, "pp", pp, tp * cp),
        _group(cluster, "dp", dp, tp * cp * pp),
    ]
    pipeline_span = tp * cp * pp
    notes = []
    tp_inside = tp <= cluster.gpus_per_node and cluster.gpus_per_node % tp == 0
    if not tp_inside:
        notes.append(f"tp={tp} does not fit in a node of {cluster.gpus_per_node} GPUs: "
                     "tensor-parallel collectives cross the fabric on every layer")
    pipeline_inside = int(span_level(cluster, np.asarray(pipeline_span))) <= LEAF
    if pp > 1 and not pipeline_inside:
        notes.append(f"a pipeline spans {pipeline_span} GPUs, more than one leaf switch joins "
                     f"({cluster.gpus_per_leaf}, {cluster.fabric} fabric): stage-to-stage "
                     "sends cross the spine")
    crossing = [g.name for g in groups if g.size > 1 and g.reaches == LEVEL_NAMES[REGION]]
    if crossing:
        notes.append(
            f"{', '.join(crossing)} collectives cross regions (region = {cluster.region_gpus} "
            f"GPUs, job = {gpus}): keep only data parallelism across regions, with "
            "hierarchical or asynchronous reduction"
        )
    return Placement(
        nodes=nodes,
        racks=racks,
        groups=groups,
        tp_inside_node=tp_inside,
        pipeline_inside_leaf=pipeline_inside or pp == 1,
        crosses_regions=crossing,
        notes=notes,
    )


def rank_coordinates(layout: Layout, ranks=None) -> dict[str, np.ndarray]:
    """(dp, pp, cp, tp) coordinate of each global rank (all of them by default)."""
    ranks = np.arange(layout.gpus) if ranks is None else np.asarray(ranks)
    dp, pp, cp, tp = np.unravel_index(ranks, (layout.dp, layout.pp, layout.cp, layout.tp))
    return {"rank": ranks, "dp": dp, "pp": pp, "cp": cp, "tp": tp}


def rank_table(cluster: ClusterConfig, layout: Layout, *, limit: int = 64) -> list[dict]:
    """The first `limit` ranks with their node, rack and coordinates, for people to read."""
    coords = rank_coordinates(layout, np.arange(min(limit, layout.gpus)))
    node = coords["rank"] // cluster.gpus_per_node
    return [
        {
            "rank": int(r),
            "node": int(n),
            "rack": int(n // cluster.nodes_per_rack),
            "dp": int(d),
            "pp": int(p),
            "cp": int(c),
            "tp": int(t),
        }
        for r, n, d, p, c, t in zip(coords["rank"], node, coords["dp"], coords["pp"],
                                    coords["cp"], coords["tp"], strict=True)
    ]
