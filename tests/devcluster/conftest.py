"""The real cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
JobSet and Kueue managers built from the pinned Go modules (fm dev cluster build; the
first build on a machine takes minutes and is cached), started once per test module on
127.0.0.1 with the process kubelet, and stopped after it with nothing left running."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from fm_pipeline.defaults import DEV_CLUSTER_TENANTS
from fm_pipeline.devcluster import processes
from fm_pipeline.devcluster.build import build_components, default_cache
from fm_pipeline.devcluster.cluster import ClusterInfo, DevCluster, default_nodes
from fm_pipeline.devcluster.rest import Rest
from fm_pipeline.scheduling.tenants import load_tenants


@pytest.fixture(scope="session")
def components():
    return build_components(default_cache(), log=lambda line: print(line, flush=True))


@contextlib.contextmanager
def started(components, state: Path, *, tenants, image_env: dict | None = None):
    """A dev cluster of two nodes up for the block; nothing of it left running after."""
    dev = DevCluster(components, state, nodes=default_nodes(2), tenants=tenants,
                     # The host's one CPU-peak measurement, as tests/conftest.py gives
                     # every process; a pod would otherwise measure it again.
                     image_env={"FM_CPU_PEAKS_FILE": os.environ["FM_CPU_PEAKS_FILE"],
                                **(image_env or {})})
    info = dev.up()
    try:
        yield info
    finally:
        dev.down()
        assert not processes.running(info.tag), "a dev cluster process outlived down()"


@pytest.fixture(scope="module")
def cluster(components, tmp_path_factory, cpu_peaks_file) -> ClusterInfo:
    with started(components, tmp_path_factory.mktemp("dev-cluster"),
                 tenants=load_tenants(DEV_CLUSTER_TENANTS)) as info:
        yield info


@pytest.fixture(scope="module")
def kube(cluster) -> Rest:
    return Rest.from_kubeconfig(Path(cluster.kubeconfig))
