"""A rank's failure domain for the fast tier's replica ring: $FM_RACK, else on Kubernetes
its node's label read from the API (a kube-apiserver TEST DOUBLE on 127.0.0.1 serves the
node), unknown (None, with the reason logged) when the API or the label is missing."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client as k8s

from fm_pipeline.checkpoint.fast_paths import (
    NODE_NAME_ENV,
    RACK_ENV,
    RACK_LABEL_ENV,
    node_rack,
    replica_peers,
)

LABEL = "example.com/rack"


@pytest.fixture
def core(api):
    api.add_node("gpu-7", {LABEL: "r12", "kubernetes.io/hostname": "gpu-7"})
    api.add_node("gpu-8", {"kubernetes.io/hostname": "gpu-8"})
    return k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=api.url)))


def test_the_rack_is_the_nodes_label(core, monkeypatch, caplog):
    monkeypatch.delenv(RACK_ENV, raising=False)
    monkeypatch.setenv(RACK_LABEL_ENV, LABEL)
    monkeypatch.setenv(NODE_NAME_ENV, "gpu-7")
    assert node_rack(api=core) == "r12"
    with caplog.at_level(logging.WARNING):
        monkeypatch.setenv(NODE_NAME_ENV, "gpu-8")
        assert node_rack(api=core) is None
        monkeypatch.setenv(NODE_NAME_ENV, "gpu-9")
        assert node_rack(api=core) is None
    said = [r.getMessage() for r in caplog.records]
    assert any("gpu-8 has no example.com/rack label" in m for m in said), said
    assert any("gpu-9" in m and "unknown" in m for m in said), said
    monkeypatch.setenv(RACK_ENV, "rack-a")  # set by the launcher: no API call
    assert node_rack(api=None) == "rack-a"


def test_racks_read_this_way_put_every_replica_in_another_rack(api, core, monkeypatch):
    monkeypatch.delenv(RACK_ENV, raising=False)
    monkeypatch.setenv(RACK_LABEL_ENV, LABEL)
    nodes = ["n0", "n1", "n2", "n3"]
    for node, rack in zip(nodes, ("r1", "r1", "r2", "r2"), strict=True):
        api.add_node(node, {LABEL: rack})
    racks = []
    for node in nodes:  # what each node's ranks read
        monkeypatch.setenv(NODE_NAME_ENV, node)
        racks.append(node_rack(api=core))
    assert racks == ["r1", "r1", "r2", "r2"]
    peers = replica_peers(nodes, racks)
    assert all(racks[p] != racks[r] for r, p in enumerate(peers)), peers
