"""A rank's failure domain for the fast tier's replica ring: the launcher's FM_RACK, else on
Kubernetes its node's label (FM_RACK_LABEL, FM_NODE_NAME: config.worker_env) read from the API (a kube-apiserver TEST DOUBLE on 127.0.0.1 serves the
node), unknown (None, with the reason logged) when the API or the label is missing."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client as k8s

from fm_pipeline.checkpoint.fast_paths import node_rack, replica_peers
from fm_pipeline.config.worker_env import WorkerEnv

LABEL = "example.com/rack"


@pytest.fixture
def core(api):
    api.add_node("gpu-7", {LABEL: "r12", "kubernetes.io/hostname": "gpu-7"})
    api.add_node("gpu-8", {"kubernetes.io/hostname": "gpu-8"})
    return k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=api.url)))


def _on(node: str, **env) -> WorkerEnv:
    """What a pod on `node` is told (launch/pod.py), as its entry point reads it."""
    return WorkerEnv.from_environ({"FM_RACK_LABEL": LABEL, "FM_NODE_NAME": node, **env})


def test_the_rack_is_the_nodes_label(core, caplog):
    assert node_rack(_on("gpu-7"), api=core) == "r12"
    with caplog.at_level(logging.WARNING):
        assert node_rack(_on("gpu-8"), api=core) is None
        assert node_rack(_on("gpu-9"), api=core) is None
    said = [r.getMessage() for r in caplog.records]
    assert any("gpu-8 has no example.com/rack label" in m for m in said), said
    assert any("gpu-9" in m and "unknown" in m for m in said), said
    # set by the launcher: no API call
    assert node_rack(_on("gpu-9", FM_RACK="rack-a"), api=None) == "rack-a"


def test_racks_read_this_way_put_every_replica_in_another_rack(api, core):
    nodes = ["n0", "n1", "n2", "n3"]
    for node, rack in zip(nodes, ("r1", "r1", "r2", "r2"), strict=True):
        api.add_node(node, {LABEL: rack})
    racks = []
    for node in nodes:  # what each node's ranks read
        racks.append(node_rack(_on(node), api=core))
    assert racks == ["r1", "r1", "r2", "r2"]
    peers = replica_peers(nodes, racks)
    assert all(racks[p] != racks[r] for r, p in enumerate(peers)), peers
