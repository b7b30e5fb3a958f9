"""The fast tier across a JobSet restart (2 nodes x 2 ranks, the rendered pod command, in
network namespaces where this machine allows them): node 1 is lost after step 6, node 0's
torchrun fails on the lost peer, and the JobSet controller recreates every pod
(BlockingRecreate: the old pods are gone first), node 1's on a new node.

The pods' own /dev/shm died with them; what outlives them is the fast tier's hostPath in
node memory (launch/pod.py). So node 0's recreated ranks restore their own snapshots from
it, and ranks 2 and 3 (on the new node, whose memory is empty) get theirs from the
replicas node 0 holds: no fall back to the durable checkpoint of step 4.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.scenarios.fast import check_redone_steps_bitwise
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event
from fm_pipeline.rundir.records import METRICS_FILE, SEGMENTS_FILE, read_records

STEPS, DURABLE_EVERY, LOSE_NODE_AT = 10, 4, 6


def recreate_pods_fast(ws: ChaosWorkspace) -> FaultResult:
    from fm_pipeline.resilience.multinode import PodNodes, node_network

    job = ws.job("chaos-recreate-fast", **{
        "parallelism.nnodes": 2, "parallelism.nproc_per_node": 2,
        "training.steps": STEPS, "training.segment_steps": STEPS,
        "checkpoint.every_steps": DURABLE_EVERY, "checkpoint.memory_every_steps": 1})
    rendered, root = ws.pod_segment(job, "recreate-fast")
    result = FaultResult("recreate-pods-fast", expected=(
        "after a lost node and a JobSet restart (every pod recreated, one on a new node) "
        "the ranks restore from node memory: node 0's own snapshots and, for the new "
        "node's ranks, node 0's replicas of them; newer than the durable checkpoint"))
    repo = Path(__file__).resolve().parents[3]
    with contextlib.ExitStack() as stack:
        network, where = node_network(stack, 2)
        nodes = PodNodes(rendered, root=root, network=network, store_uri=str(ws.store_dir),
                         cwd=repo)
        nodes.start()
        try:
            nodes.wait_for_step(LOSE_NODE_AT)
            nodes.kill_node(1)
            lost_at = time.time()
            result.injected = (f"every process of node 1 SIGKILLed after step {LOSE_NODE_AT}; "
                               f"both pods recreated, node 1's on a new node; nodes in {where}")
            append_event(nodes.runs_dir, "fault_injected", job=job.name,
                         fault=result.fault, target=result.injected)
            first_codes = nodes.wait(timeout_s=180)
        finally:
            nodes.stop()
        again = PodNodes(rendered, root=root, network=network, store_uri=str(ws.store_dir),
                         cwd=repo)
        again.wipe_node_memory(1)  # a new node: nothing of the lost one's memory
        again.start(attempt=1)
        try:
            codes = again.wait(timeout_s=300)
        finally:
            again.stop()
    segments = [s for s in read_records(nodes.runs_dir / SEGMENTS_FILE, "segment")
                if s.get("time", 0) >= again.started_at]
    steps = read_records(nodes.runs_dir / METRICS_FILE, "step")
    result.record_figures(nodes.runs_dir)
    restart = segments[-1].get("inplace_restart") if segments else None
    result.outcome = (f"node 0 exited {first_codes[0]}; recreated pods exited {codes}; "
                      f"restart {restart}")
    result.check(f"the recreated pods both exit 0 ({codes}) and the segment completed at "
                 f"step {STEPS}", codes == [0, 0] and bool(segments)
                 and segments[-1].get("end_step") == STEPS
                 and segments[-1].get("exit_reason") == "completed")
    result.check("the restart says the pods were recreated", bool(restart)
                 and restart["pods_recreated"] and "recreated" in restart["cause"])
    if restart:
        result.check(f"restored from node memory ({restart['tier']}), ranks 2 and 3 from "
                     f"node 0's replicas (from_peer {restart['from_peer']})",
                     restart["tier"] == "memory-peer" and restart["from_peer"] == [2, 3])
        result.check(f"step {restart['restored_step']} is newer than the durable checkpoint "
                     f"({LOSE_NODE_AT // DURABLE_EVERY * DURABLE_EVERY}), "
                     f"{restart['steps_redone']} step(s) redone (<= 2: one interval and a "
                     f"replica in flight)",
                     restart["restored_step"] > LOSE_NODE_AT // DURABLE_EVERY * DURABLE_EVERY
                     and restart["steps_redone"] is not None
                     and restart["steps_redone"] <= 2)
    check_redone_steps_bitwise(result, steps, some_redone=False)  # 0 when step 6 was whole
    resumed = next((r for r in steps if r["time"] > again.started_at), None)
    if resumed is not None:
        result.notes.append(f"node lost -> first step after the recreate: "
                            f"{resumed['time'] - lost_at:.1f} s")
    if restart:
        result.notes.append(f"restored step {restart['restored_step']} from {restart['tier']} "
                            f"in {restart['restore_s']} s")
    if not result.passed:
        result.notes.append(again.tail(60))
    return result
