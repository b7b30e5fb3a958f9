"""The fast tier across two emulated nodes (4 real gloo ranks, FSDP2; tests/checkpoint/
fast_worker.py): snapshots replicated to the other node, and the restore after each fault,
applied in turn: intact -> every rank its own copy; rank 1's own copy corrupt -> its
replica, with the reason; node 1 lost -> ranks 2 and 3 from node 0's replicas, at the newest
step every rank can still load; rank 2's replica gone too -> nothing (the durable tier's
turn), saying which rank lacks a copy. Every restore is bitwise the trained state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fm_pipeline.checkpoint.fast_paths import replica_peers

pytestmark = pytest.mark.slow


def test_replicas_survive_a_corrupt_copy_and_a_lost_node(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=4", "-m", "tests.checkpoint.fast_worker",
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["peers"] == [2, 3, 0, 1]
    assert report["snapshot"]["snapshots"] == 2 and report["snapshot"]["replicas_held"] == 2
    r = report["restores"]
    assert (r["intact"]["step"], r["intact"]["from_peer"], r["intact"]["tier"]) == \
        (4, [], "memory")
    assert r["corrupt-own"]["step"] == 4 and r["corrupt-own"]["from_peer"] == [1]
    assert any("CRC32C mismatch" in s for s in r["corrupt-own"]["skipped"])
    # Rank 1's step 4 is corrupt here and its replica went with node 1: step 2 is the
    # newest that every rank can load.
    lost = r["node-1-lost"]
    assert lost["step"] == 2 and lost["from_peer"] == [2, 3] and lost["tier"] == "memory-peer"
    assert lost["cursor"] == 8
    assert all(v.get("equal", True) for v in r.values()), r
    assert "none" in r["both-lost"]
    assert any("no step that every rank can load" in s for s in r["both-lost"]["none"])


def test_replica_peers_alternate_racks_and_keep_the_local_index():
    # Two nodes: each rank's replica is the same local rank of the other node.
    assert replica_peers(["a", "a", "b", "b"], [None] * 4) == [2, 3, 0, 1]
    # Four nodes in two racks: the ring alternates racks, so no replica shares a rack.
    nodes, racks = ["n0", "n1", "n2", "n3"], ["r1", "r1", "r2", "r2"]
    peers = replica_peers(nodes, racks)
    assert all(racks[p] != racks[r] for r, p in enumerate(peers)), peers
    assert sorted(peers) == [0, 1, 2, 3]  # every node holds exactly one other's replica
    assert replica_peers(["a", "a"], [None, None]) == [None, None]  # one node: none
