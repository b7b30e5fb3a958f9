"""Two nodes without a shared filesystem: each torchrun agent has its own FM_HOME (its own
local checkpoint tier), both share an S3 store on loopback. The commit is collective (no rank
reads another node's disk), the store holds the whole checkpoint, and a resume where one
node's disk was replaced by an empty one fetches what each node lacks and restores bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fm_pipeline.catalog import CheckpointRef, read_manifest, validate
from tests.checkpoint.test_resharding import assert_same
from tests.checkpoint.tiny import tiny_job
from tests.conftest import REPO, free_port
from tests import local_site

STEP3 = "step-00000003"


def run_nodes(mode: str, homes: list, out, store_uri: str, timeout_s: float = 240) -> None:
    port = free_port()
    procs = []
    for node, home in enumerate(homes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               "--rdzv-id=ckpt-nodes", f"--rdzv-conf=is_host={1 if node == 0 else 0}",
               "--local-addr=127.0.0.1", "-m", "tests.checkpoint.node_worker", mode, str(out),
               store_uri]
        env = {**os.environ, "FM_HOME": str(home), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-5000:]


def reports(out, mode: str) -> dict[int, dict]:
    return {r: json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.slow
def test_two_nodes_with_their_own_disks_commit_upload_and_resume(tmp_path, s3_bucket):
    store_uri = f"s3://{s3_bucket}/fm"
    node_a, node_b, fresh = (tmp_path / n for n in ("node-a", "node-b", "fresh-node"))
    run_nodes("save", [node_a, node_b], tmp_path, store_uri)

    saved = reports(tmp_path, "save")
    assert {r["copies"] for r in saved.values()} == {2}  # no directory is shared
    on_disk = {r: set(saved[r]["files"][STEP3]) for r in (0, 1)}
    # each node holds its own rank's shard (rank 0 also .metadata and the probe-less rest)
    # and a copy of the manifest, never the other node's shard
    assert on_disk[0] >= {"__0_0.distcp", ".metadata", "manifest.json"}
    assert on_disk[1] == {"__1_0.distcp", "manifest.json"}
    store = local_site.site().open_store(store_uri)
    remote = CheckpointRef.remote(store, f"checkpoints/ckpt-test/{STEP3}")
    job = tiny_job()
    assert validate(remote, job) == []  # whole in the store, checksums verified
    manifest = read_manifest(remote)
    assert {f.path for f in manifest.files} == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    assert (manifest.parallelism.world_size, manifest.parallelism.nnodes) == (2, 2)
    rank0_dir = CheckpointRef.local(f"{saved[0]['fm_home']}/runs/ckpt-test/checkpoints/{STEP3}")
    assert [(p.where, p.kind) for p in validate(rank0_dir, job)] == [("__1_0.distcp", "missing")]
    # retention ran on both nodes: step 1 is still kept (keep_last=10) on both
    assert all("step-00000001" in saved[r]["files"] for r in (0, 1))

    # Node B's disk is gone: an empty node takes its place; node A keeps its share.
    rank0_home = saved[0]["fm_home"]
    run_nodes("resume", [rank0_home, fresh], tmp_path, store_uri)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    source = torch.load(tmp_path / "source.pt", weights_only=False)
    assert_same(resumed["model"], source["model"], "model after resume")
    assert_same(resumed["optimizer"], source["optimizer"], "optimizer after resume")
    assert resumed["cursor"] == source["cursor"] == {"samples_consumed": 12}
    after = reports(tmp_path, "resume")
    assert all(r["download_s"] > 0 for r in after.values())  # both fetched what they lacked
    for r in (0, 1):  # both copies of step 3 are whole now, and step 4 is committed remotely
        assert set(after[r]["files"][STEP3]) >= {"__0_0.distcp", "__1_0.distcp", ".metadata",
                                                "manifest.json"}
    home = {after[r]["fm_home"] for r in (0, 1)}
    assert home == {rank0_home, str(fresh)}
    for h in home:
        assert validate(CheckpointRef.local(f"{h}/runs/ckpt-test/checkpoints/{STEP3}"), job) == []
    assert read_manifest(CheckpointRef.remote(store, "checkpoints/ckpt-test/step-00000004")
                         ).step == 4
