"""Where a node keeps its fast-tier snapshots and which node holds each rank's replica.
Torch-free: the launchers and the multi-node harness name the same directory the ranks use
(fm_pipeline.checkpoint.fast_tier)."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from fm_pipeline.config.worker_env import WorkerEnv

log = logging.getLogger(__name__)


def node_rack(worker: WorkerEnv, api=None) -> str | None:
    """This node's failure domain: the launcher's (FM_RACK), else on Kubernetes the value
    of the node's label named by FM_RACK_LABEL (the pod's service account may get nodes:
    launch/keeper.py renders the ClusterRole); None when unknown, with the reason logged
    (the ring then follows the nodes' order). `api`: a kubernetes CoreV1Api (default: the
    in-cluster one)."""
    if worker.rack:
        return worker.rack
    label, node = worker.rack_label, worker.node_name
    if not (label and node):
        return None
    try:
        if api is None:
            from kubernetes import client, config

            config.load_incluster_config()
            api = client.CoreV1Api()
        labels = api.read_node(node).metadata.labels or {}
    except Exception as e:  # noqa: BLE001 - any API failure leaves the domain unknown
        log.warning("fast tier: node %s's %s label is unknown (%s); replicas follow the "
                    "nodes' order", node, label, str(e).splitlines()[0][:200])
        return None
    if label not in labels:
        log.warning("fast tier: node %s has no %s label; replicas follow the nodes' order",
                    node, label)
    return labels.get(label)


def fast_root(worker: WorkerEnv) -> Path:
    """The node's fast-tier directory: the launcher's (FM_FAST_TIER_DIR), else /dev/shm."""
    return worker.fast_dir or _shm("fm-fast")


def starts_root() -> Path:
    """Where this node's agents count their worker groups (rundir.attempts): /dev/shm,
    which in a pod is the pod's own (an emptyDir), so a recreated pod starts counting at 0
    even when the fast tier's directory (a hostPath) outlived the old one."""
    return _shm("fm-starts")


def _shm(name: str) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / name
    return Path(tempfile.gettempdir()) / name


def replica_peers(nodes: list[str], racks: list[str | None]) -> list[int | None]:
    """For each rank (given its node and rack), the rank that holds its replica: the same
    local index on the next node of a ring that takes the racks in turn, so that neighbours
    are in different racks wherever the racks allow. None for all with a single node."""
    order_of_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        order_of_node.setdefault(node, []).append(rank)
    if len(order_of_node) < 2:
        return [None] * len(nodes)
    by_rack: dict[str, list[str]] = {}
    for node, ranks in order_of_node.items():
        by_rack.setdefault(str(racks[ranks[0]]), []).append(node)
    ring: list[str] = []
    queues = [list(v) for _, v in sorted(by_rack.items())]
    while any(queues):
        for q in queues:
            if q:
                ring.append(q.pop(0))
    nxt = {node: ring[(i + 1) % len(ring)] for i, node in enumerate(ring)}
    peers: list[int | None] = []
    for rank, node in enumerate(nodes):
        local = order_of_node[node].index(rank)
        there = order_of_node[nxt[node]]
        peers.append(there[local % len(there)])
    return peers
