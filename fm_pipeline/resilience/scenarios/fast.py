"""The fast tier under real faults, 2 nodes x 2 ranks running the Kubernetes pod command (in
network namespaces where this machine allows them), one launch living through three faults
with `resilience.inplace_restarts`:

    after step 3   SIGKILL rank 3 (a worker on node 1)     -> restart in place, own copies
    after step 7   node 1 lost (every process), a spare     -> ranks 2, 3 from the replicas
                   joins in its place                          node 0 holds of them
    after step 10  node 1 lost again, and node 0's          -> no step every rank can load
                   replicas with it                            from memory: the durable tier

No pod is recreated and no new launch starts: node 0's agent restarts its workers each time
and waits in the rendezvous until a node joins (torchrun's elastic agent); the spare has
nothing of the lost node's memory (its fast-tier directory starts empty).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event
from fm_pipeline.rundir.records import METRICS_FILE, SEGMENTS_FILE, read_records

STEPS, DURABLE_EVERY = 12, 4
KILL_WORKER_AT, LOSE_NODE_AT, LOSE_BOTH_AT = 3, 7, 10


@dataclass
class FastFaultsRun:
    result: FaultResult
    restarts: list[dict]  # the segments' inplace_restart records, in order
    resume_s: list[float | None]  # per fault: -> the first step of the restarted attempt


def lose_node_fast(ws: ChaosWorkspace) -> FaultResult:
    """The scenario (fault matrix, tests), with a 1 s rendezvous heartbeat."""
    return run_fast_faults(ws, keep_alive_s=1).result


def run_fast_faults(ws: ChaosWorkspace, *, keep_alive_s: int | None) -> FastFaultsRun:
    """`keep_alive_s`: torchrun's rendezvous heartbeat (3 missed ones drop the lost node;
    torch's default is 5 s); None keeps torch's default (what benchmarks.recovery uses)."""
    from fm_pipeline.resilience.multinode import PodNodes, node_network

    job = ws.job("chaos-lose-node-fast", **{
        "parallelism.nnodes": 2, "parallelism.nproc_per_node": 2,
        "training.steps": STEPS, "training.segment_steps": STEPS,
        "checkpoint.every_steps": DURABLE_EVERY, "checkpoint.memory_every_steps": 1,
        "resilience.inplace_restarts": 3})
    rendered, root = ws.pod_segment(job, "lose-node-fast")
    result = FaultResult("lose-node-fast", expected=(
        "each fault is survived inside the one launch: the killed worker's node restores "
        "its own memory copy, the spare replacing a lost node gets its ranks' shards from "
        "the peer's replicas, and with both copies gone the durable tier; at most one fast "
        "interval redone from memory, every redone step bitwise the same"))
    conf = f"keep_alive_interval={keep_alive_s},keep_alive_max_attempt=3" \
        if keep_alive_s else ""
    faults: list[tuple[str, float]] = []
    with contextlib.ExitStack() as stack:
        network, where = node_network(stack, 2)
        nodes = PodNodes(rendered, root=root, network=network, store_uri=str(ws.store_dir),
                         cwd=Path(__file__).resolve().parents[3], rdzv_conf=conf)

        def inject(what: str) -> None:
            faults.append((what, time.time()))
            # detect: false: no segment end marks it; the restart is inside the launch.
            append_event(nodes.runs_dir, "fault_injected", job=job.name, fault=result.fault,
                         target=what, detect=False)

        nodes.start()
        try:
            nodes.wait_for_step(KILL_WORKER_AT)
            os.kill(nodes.worker_pid(1, 3), signal.SIGKILL)
            inject(f"SIGKILL to rank 3 (node 1) after step {KILL_WORKER_AT}")
            _wait_for_restart(nodes, 1)
            nodes.wait_for_step(LOSE_NODE_AT)
            nodes.kill_node(1)
            inject(f"every process of node 1 SIGKILLed after step {LOSE_NODE_AT}; a spare "
                   f"joins")
            nodes.replace_node(1, attempt=1)
            _wait_for_restart(nodes, 2)
            nodes.wait_for_step(LOSE_BOTH_AT)
            survivors = [nodes.worker_pid(0, rank) for rank in (0, 1)]
            nodes.kill_node(1)
            # Deleted once node 0's workers are gone: a replica they were still committing
            # would otherwise come back after the delete.
            _wait_gone(survivors, nodes)
            shutil.rmtree(_held_dir(nodes.fast_dir(0), job.name))
            inject(f"node 1 lost again after step {LOSE_BOTH_AT}, and node 0's replicas "
                   f"of its ranks deleted")
            nodes.replace_node(1, attempt=2)
            codes = nodes.wait(timeout_s=300)
        finally:
            nodes.stop()
    result.injected = "; ".join(w for w, _ in faults) + f"; nodes in {where}"
    segments = read_records(nodes.runs_dir / SEGMENTS_FILE, "segment")
    restarts = [s["inplace_restart"] for s in segments if s.get("inplace_restart")]
    steps = read_records(nodes.runs_dir / METRICS_FILE, "step")
    result.record_figures(nodes.runs_dir)
    tiers = [r["tier"] for r in restarts]
    result.outcome = (f"agents exited {codes}; restarts restored "
                      + ", ".join(f"step {r['restored_step']} from {r['tier']}"
                                  for r in restarts))
    check_restarts(result, restarts, codes=codes, segments=segments)
    check_redone_steps_bitwise(result, steps)
    resume = resume_times(faults, steps)
    result.notes.append(f"fault -> first resumed step: {resume} s")
    result.notes.append(f"tiers: {tiers}")
    if not result.passed:  # what the agents printed is what tells why
        result.notes.append(nodes.tail(60))
    return FastFaultsRun(result=result, restarts=restarts, resume_s=resume)


def _held_dir(fast_dir: Path, job_name: str) -> Path:
    (run,) = [p for p in (fast_dir / job_name).iterdir() if p.is_dir()]
    return run / "held"


def _wait_gone(pids: list[int], nodes, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return
        time.sleep(0.1)
    raise TimeoutError(f"node 0's workers {pids} still run {timeout_s:.0f} s after node 1 "
                       f"was lost:\n{nodes.tail()}")


def _wait_for_restart(nodes, n: int, timeout_s: float = 240) -> None:
    """Until the n-th in-job restart has restored (its record in the job's events)."""
    from fm_pipeline.rundir.events import read_events

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen, _ = read_events(nodes.runs_dir, kinds=("inplace_restart",))
        if len(seen) >= n:
            return
        if nodes.procs[0].poll() is not None:
            raise RuntimeError(f"node 0's agent exited before restart {n}:\n{nodes.tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"no in-job restart {n} in {timeout_s:.0f} s:\n{nodes.tail()}")


def check_restarts(result: FaultResult, restarts: list[dict], *, codes, segments) -> None:
    result.check(f"one launch: both agents exit 0 ({codes}) and the last segment completed "
                 f"at step {STEPS}", codes == [0, 0] and bool(segments)
                 and segments[-1].get("exit_reason") == "completed"
                 and segments[-1].get("end_step") == STEPS)
    result.check(f"three in-job restarts recorded ({len(restarts)})", len(restarts) == 3)
    if len(restarts) != 3:
        return
    worker, node, both = restarts
    result.check(f"one attempt per fault ({[r['attempt'] for r in restarts]}); the killed "
                 f"worker's restart names no node as joined ({worker['joined_nodes']})",
                 [r["attempt"] for r in restarts] == [1, 2, 3]
                 and worker["joined_nodes"] == [])
    result.check(f"killed worker: restored from the node's own memory ({worker['tier']}), "
                 f"{worker['steps_redone']} step(s) redone (<= 1)",
                 worker["tier"] == "memory" and worker["steps_redone"] is not None
                 and worker["steps_redone"] <= 1)
    result.check(f"lost node: its ranks from the peer's replicas ({node['tier']}, from_peer "
                 f"{node['from_peer']}), cause {node['cause']!r}",
                 node["tier"] == "memory-peer" and node["from_peer"] == [2, 3]
                 and node["joined_nodes"] == [1] and (node["steps_redone"] or 0) <= 1)
    newest_durable = LOSE_BOTH_AT // DURABLE_EVERY * DURABLE_EVERY
    result.check(f"both copies gone: the durable tier ({both['tier']}) at step "
                 f"{both['restored_step']} (newest durable {newest_durable}), why recorded: "
                 f"{'; '.join(both['skipped'])[:160]!r}",
                 both["tier"] in ("local", "store") and both["restored_step"] == newest_durable
                 and any("no valid copy" in s or "every rank can load" in s
                         for s in both["skipped"]))


def check_redone_steps_bitwise(result: FaultResult, steps: list[dict], *,
                               some_redone: bool = True) -> None:
    """A step trained again after a restore has the loss it had the first time, to the bit
    (same topology on CPU: weights, optimizer, data position and RNG all restored).
    `some_redone`: the scenario's faults must have made at least one step run again."""
    first: dict[int, float] = {}
    differ, redone = [], 0
    for r in steps:
        if r["step"] in first:
            redone += 1
            if r["loss"] != first[r["step"]]:
                differ.append((r["step"], first[r["step"]], r["loss"]))
        else:
            first[r["step"]] = r["loss"]
    result.check(f"{redone} redone step(s), each with the loss of its first run: "
                 f"{differ or 'all equal'}", (redone > 0 or not some_redone) and not differ)


def resume_times(faults: list[tuple[str, float]], steps: list[dict]) -> list[float | None]:
    """Per fault: seconds to the first step completed by a segment started after it."""
    out = []
    for _, at in faults:
        before = {r.get("segment") for r in steps if r["time"] <= at}
        first = next((r for r in steps if r["time"] > at and r.get("segment") not in before),
                     None)
        out.append(round(first["time"] - at, 1) if first else None)
    return out
