"""The Kubernetes pod command as 2 nodes x 1 rank, each node in its own network namespace
(joined by veth pairs to a bridge), c10d rendezvous over that network: train, checkpoint,
lose node 1 entirely (every process in its namespace SIGKILLed), recreate both pods, resume
from the newest checkpoint on the shared claim. Fails with the reason where namespaces
cannot be made: the test claims 2 namespaced nodes, and a fallback to loopback is not that."""

from __future__ import annotations

import os
import subprocess

import pytest

from fm_pipeline.resilience.netns import PREFIX, availability, namespaces
from fm_pipeline.resilience.scenarios.process import kill_node
from tests.resilience.records_check import assert_figures_agree

pytestmark = pytest.mark.slow


def _ours() -> list[str]:
    return [n for n in namespaces() if n.startswith(f"{PREFIX}-{os.getpid()}-")]


def _runs(ws):
    """The shared claim's run directory of the newest kill-node run in the workspace."""
    (claim,) = sorted((ws.home / "pods").glob("kill-node-*"))[-1:]
    (runs,) = [p for p in claim.glob("pvc-*/*") if (p / "metrics.jsonl").exists()]
    return runs


def test_two_namespaced_nodes_lose_one_and_resume_from_the_shared_checkpoint(chaos_ws):
    if why := availability():
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    host_addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True,
                                    text=True).stdout
    with chaos_ws.active():
        result = kill_node(chaos_ws)
    # Root, but the kernel refused namespaces: the run fell back to loopback, which is not
    # what this test claims to show.
    assert "nodes in loopback" not in result.injected, result.injected
    assert "nodes in network namespaces" in result.injected
    assert result.passed, result.failed_checks() or result.error
    assert result.steps_lost is not None and result.steps_lost >= 0
    assert result.detect_s is not None and result.resume_s is not None
    assert_figures_agree(result, _runs(chaos_ws))
    # Namespaces, links and addresses are gone; the host's own network never changed.
    assert _ours() == []
    assert subprocess.run(["ip", "-o", "addr"], capture_output=True,
                          text=True).stdout == host_addresses


def test_fast_tier_survives_a_killed_worker_a_lost_node_and_both_copies_lost(chaos_ws):
    """2 nodes x 2 ranks, one launch, three faults (fm_pipeline.resilience.scenarios.fast):
    own memory copy, the peer's replicas for a spare that replaced the lost node, then the
    durable tier once both copies are gone; redone steps bitwise the same."""
    from fm_pipeline.resilience.scenarios.fast import lose_node_fast

    with chaos_ws.active():
        result = lose_node_fast(chaos_ws)
    assert result.injected.endswith("nodes in network namespaces"), result.injected
    assert result.passed, (result.failed_checks(), result.outcome, result.notes)
    assert result.steps_lost is not None and result.steps_lost > 0
    assert _ours() == []


def test_fast_tier_outlives_a_jobset_restart_in_the_nodes_memory(chaos_ws):
    """2 nodes x 2 ranks: node 1 lost, every pod recreated (node 1's on a new node): the
    fast tier's hostPath outlives the pods, so the ranks restore from memory, the new
    node's from node 0's replicas (fm_pipeline.resilience.scenarios.fast_recreate)."""
    from fm_pipeline.resilience.scenarios.fast_recreate import recreate_pods_fast

    with chaos_ws.active():
        result = recreate_pods_fast(chaos_ws)
    assert "nodes in network namespaces" in result.injected, result.injected
    assert result.passed, (result.failed_checks(), result.outcome, result.notes)
    assert _ours() == []
