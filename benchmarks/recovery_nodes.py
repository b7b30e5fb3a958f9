"""The in-job restart and the durable path of one 2-node x 2-rank job, in network namespaces:
the multi-node half of `benchmarks.recovery`.

No daemon: the pod command of the rendered JobSet runs as two nodes
(fm_pipeline.resilience.multinode.PodNodes, as the fast-tier scenario does). Rank 0 raises
after step 3 (FM_FAULT_FAIL_AT, spent in a restarted attempt):

  inplace_resume_s_2_nodes  with `resilience.inplace_restarts` 1 and snapshots every 2
                            steps: every rank on both nodes leaves its process group, they
                            meet again in their processes and restore from memory; the fault
                            -> the first step of the restarted attempt
  durable_resume_s_2_nodes  without: both nodes' torchrun agents exit, the pods are created
                            again (what the JobSet controller does, here at once: its own
                            delay is not in this figure) and restore the step-2 checkpoint
                            from the shared claim; the fault -> their first step

Needs network namespaces (root, iproute2): without them it raises, naming why, rather than
measure loopback and call it two nodes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

STEPS, FAULT_AT = 8, 3
REPO = Path(__file__).resolve().parents[1]


def _attempts(runs_dir: Path) -> list[list[dict]]:
    """Rank 0's step records per attempt (a segment id each), in order."""
    from fm_pipeline.rundir.records import METRICS_FILE, read_records

    attempts: dict[str, list[dict]] = {}
    for record in read_records(runs_dir / METRICS_FILE, "step"):
        attempts.setdefault(record["segment"], []).append(record)
    return list(attempts.values())


def _job(ws, name: str, *, inplace: bool):
    return ws.job(name, **{
        "parallelism.nnodes": 2, "parallelism.nproc_per_node": 2,
        "training.steps": STEPS, "training.segment_steps": STEPS,
        "checkpoint.every_steps": 2,
        **({"checkpoint.memory_every_steps": 2, "resilience.inplace_restarts": 1}
           if inplace else {"resilience.inplace_restarts": 0})})


def _resume_after_fault(runs_dir: Path, what: str) -> float:
    first, resumed = _attempts(runs_dir)[:2]
    if first[-1]["step"] != FAULT_AT:
        raise RuntimeError(f"{what}: the first attempt ended at step {first[-1]['step']}, "
                           f"not the fault's {FAULT_AT}")
    return resumed[0]["time"] - first[-1]["time"]  # the fault raises right after this record


def measure_two_nodes(home: Path, index: int) -> dict:
    """Both figures for one repeat, each from its own job in its own directory."""
    from fm_pipeline.resilience.multinode import PodNodes, node_network
    from fm_pipeline.resilience.workspace import ChaosWorkspace
    from fm_pipeline.rundir.records import SEGMENTS_FILE, read_records

    ws = ChaosWorkspace(home)
    fault = {"FM_FAULT_FAIL_AT": f"0:{FAULT_AT}"}
    out = {}
    with ws.active(), contextlib.ExitStack() as stack:
        network, where = node_network(stack, 2)
        if network is None:
            raise RuntimeError(f"2 nodes x 2 ranks need network namespaces: {where}")
        store = str(ws.store_dir)

        def launch(rendered, root, *, env=None, attempt=0):
            """Both nodes' pods, run to their end: (the nodes, their exit codes)."""
            nodes = PodNodes(rendered, root=root, network=network, store_uri=store, env=env,
                             cwd=REPO)
            try:
                nodes.start(attempt=attempt)
                return nodes, nodes.wait(timeout_s=300)
            finally:
                nodes.stop()

        job = _job(ws, f"recovery-2n-inplace-{index}", inplace=True)
        nodes, codes = launch(*ws.pod_segment(job, "inplace"), env=fault)
        if codes != [0, 0]:
            raise RuntimeError(f"2-node in-place job: nodes exited {codes}\n{nodes.tail()}")
        restarts = [s["inplace_restart"] for s in
                    read_records(nodes.runs_dir / SEGMENTS_FILE, "segment")
                    if s.get("inplace_restart")]
        if not restarts or not restarts[0]["in_process"]:
            raise RuntimeError(f"2-node in-place job: the restart was not in the process: "
                               f"{restarts}")
        out["inplace_resume_s_2_nodes"] = _resume_after_fault(nodes.runs_dir, "in place")

        job = _job(ws, f"recovery-2n-durable-{index}", inplace=False)
        rendered, root = ws.pod_segment(job, "durable")
        nodes, codes = launch(rendered, root, env=fault)
        if 0 in codes:
            raise RuntimeError(f"2-node durable job: a node exited 0 after the fault "
                               f"({codes})\n{nodes.tail()}")
        # The JobSet recreates every pod: the same pods again, no fault planted this time.
        again, codes = launch(rendered, root, attempt=1)
        if codes != [0, 0]:
            raise RuntimeError(f"2-node durable job, recreated pods exited {codes}\n"
                               f"{again.tail()}")
        out["durable_resume_s_2_nodes"] = _resume_after_fault(nodes.runs_dir, "durable")
    return out
