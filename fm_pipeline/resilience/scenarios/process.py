"""Process faults in a live run: a worker killed, a worker hung, the job preempted, a whole
node lost (2 nodes running the Kubernetes pod command)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from fm_pipeline.launch.outcome import Outcome, diagnose
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.recovery import restored_step
from fm_pipeline.resilience.scenarios.common import (
    describe_outcome,
    fault_and_resume,
    first_line,
    recovery_checks,
)
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event


FAULT_STEP = 3  # between the checkpoints of steps 2 and 4


def kill_rank(ws: ChaosWorkspace) -> FaultResult:
    job = ws.job("chaos-kill-rank")
    result = FaultResult("kill-rank", expected=(
        "segment fails with the killed rank and signal named; resumes from the newest "
        "valid checkpoint"))
    run = fault_and_resume(ws, result, job, at_step=FAULT_STEP, fault="kill-rank",
                           inject=lambda live: f"SIGKILL to rank 1 (pid "
                                               f"{live.signal_rank(1, signal.SIGKILL)}) "
                                               f"after step {FAULT_STEP}")
    f = run.failed
    result.outcome = describe_outcome(f, run)
    result.check(f"the segment ends killed or failed, not successful ({f.outcome.value})",
                 f.outcome in (Outcome.KILLED, Outcome.FAILED))
    result.check(f"the failure names the killed rank 1 and its signal, not the peer it took "
                 f"down: rank {f.failed_rank}, {first_line(f.reason, 120)!r}",
                 f.failed_rank == 1 and "SIGKILL" in f.reason)
    recovery_checks(result, run, job, ws)
    return result


def hang_rank(ws: ChaosWorkspace) -> FaultResult:
    # Synchronous saves: a hang while an async save is in flight waits for the checkpoint
    # group's own timeout (torch's default, 30 min; see docs/resilience.md).
    job = ws.job("chaos-hang-rank", **{"checkpoint.async_save": False})
    timeout = job.resilience.collective_timeout_s
    result = FaultResult("hang-rank", expected=(
        f"the peers' collective times out after resilience.collective_timeout_s "
        f"({timeout:.0f} s), the segment fails naming the timeout, resumes"))
    run = fault_and_resume(ws, result, job, at_step=FAULT_STEP, fault="hang-rank",
                           inject=lambda live: f"SIGSTOP to rank 1 (pid "
                                               f"{live.signal_rank(1, signal.SIGSTOP)}) "
                                               f"after step {FAULT_STEP}")
    f = run.failed
    result.outcome = describe_outcome(f, run)
    result.check(f"the segment fails ({f.outcome.value}, exit {f.exit_code})",
                 f.outcome in (Outcome.FAILED, Outcome.KILLED))
    text = f"{f.reason}\n{f.traceback or ''}".lower()
    result.check("the recorded reason is the collective timeout",
                 "timed out" in text or "timeout" in text)
    # torchrun stops the other workers of a failed group with a fixed 30 s wait before
    # SIGKILL (its --shutdown-timeout only applies to signals it receives): a stopped rank
    # ignores the SIGTERM and holds the teardown that long.
    result.check(f"detected within the collective timeout + torchrun's 30 s teardown + 20 s "
                 f"slack ({timeout:.0f} + 30 + 20 s), not torch's default 30 minutes: "
                 f"{result.detect_s} s", result.detect_s <= timeout + 30 + 20)
    recovery_checks(result, run, job, ws)
    return result


def preempt(ws: ChaosWorkspace) -> FaultResult:
    job = ws.job("chaos-preempt")
    result = FaultResult("preempt", expected=(
        "every rank checkpoints at the same step and exits 75; resumes from that very "
        "checkpoint: 0 steps lost"))

    def sigterm(live) -> str:
        live.preempt()
        return f"SIGTERM to torchrun (forwarded to the workers) after step {FAULT_STEP}"

    run = fault_and_resume(ws, result, job, at_step=FAULT_STEP, inject=sigterm,
                           fault="preempt")
    f = run.failed
    result.outcome = describe_outcome(f, run)
    segment = next((s for s in reversed(ws.segments(job.name, since=run.fault_time - 600))
                    if s.get("exit_reason") == "preempted"), {})
    stop = segment.get("end_step")
    result.check(f"outcome preempted with exit code 75 ({f.outcome.value}, exit "
                 f"{f.exit_code})", f.outcome is Outcome.PREEMPTED and f.exit_code == 75)
    result.check(f"a checkpoint was committed at the stop step {stop}",
                 stop is not None and run.expected_step == stop)
    result.check(f"the stop took {segment.get('preempt_to_exit_s')} s, inside the grace "
                 f"period ({job.training.preemption_grace_s:.0f} s)",
                 (segment.get("preempt_to_exit_s") or 1e9) < job.training.preemption_grace_s)
    recovery_checks(result, run, job, ws)
    result.check("0 steps lost", result.steps_lost == 0)
    return result


def kill_node(ws: ChaosWorkspace) -> FaultResult:
    """2 nodes x 1 rank, the exact pod command of the rendered JobSet (c10d rendezvous), in
    network namespaces when this machine allows it, else on loopback. The whole node 1
    (agent and worker) is SIGKILLed; the JobSet recreates both pods (BlockingRecreate),
    which rendezvous again and resume from the shared claim's newest checkpoint."""
    from fm_pipeline.catalog import latest_valid
    from fm_pipeline.resilience.multinode import PodNodes, node_network
    from fm_pipeline.resilience.processes import wait_for_checkpoint

    job = ws.job("chaos-kill-node", **{"parallelism.nnodes": 2,
                                       "parallelism.nproc_per_node": 1})
    store = ws.store_dir
    rendered, root = ws.pod_segment(job, "kill-node")
    result = FaultResult("kill-node", expected=(
        "the surviving node's worker fails on the lost peer; both pods recreated, "
        "rendezvous again and resume from the newest checkpoint on the shared claim"))
    repo = Path(__file__).resolve().parents[3]
    with contextlib.ExitStack() as stack:
        network, where = node_network(stack, 2)
        nodes = PodNodes(rendered, root=root, network=network, store_uri=str(store), cwd=repo)
        nodes.start()
        try:
            nodes.wait_for_step(FAULT_STEP)
            wait_for_checkpoint(nodes.runs_dir, 2, timeout_s=120)
            killed = nodes.kill_node(1)
            result.injected = (f"SIGKILL to every process of node 1 ({len(killed)}: agent and "
                               f"worker) after step {FAULT_STEP}; nodes in {where}")
            append_event(nodes.runs_dir, "fault_injected", job=job.name, fault="kill-node",
                         target=result.injected)
            codes = nodes.wait(timeout_s=180)
            append_event(nodes.runs_dir, "segment_ended", job=job.name, exit_code=codes[0])
        finally:
            nodes.stop()
        node0 = root / "node-0" / "state"
        evidence = diagnose(log_dir=node0 / "torchrun", agent_error_file=node0 / "error.json",
                            output_text=nodes.output(0))
        expected = latest_valid(job, store=None, root=nodes.runs_dir / "checkpoints")
        again = PodNodes(rendered, root=root, network=network, store_uri=str(store), cwd=repo)
        again.start(attempt=1)
        try:
            codes_again = again.wait(timeout_s=300)
        finally:
            again.stop()
    segments = [s for s in _segments(nodes.runs_dir) if s.get("time", 0) >= again.started_at]
    restored = restored_step(segments[-1]) if segments else None
    result.outcome = (f"node 0 exited {codes[0]} ({first_line(evidence.reason or '', 100)}); "
                      f"recreated pods exited {codes_again}, resumed from step {restored}")
    result.record_figures(nodes.runs_dir)
    result.check(f"node 0's torchrun fails once its peer is gone (exit {codes[0]})",
                 codes[0] not in (0, None))
    result.check(f"the failure reason is recorded: {first_line(evidence.reason or '', 100)!r}",
                 bool(evidence.reason))
    result.check("the recreated pods both exit 0", codes_again == [0, 0])
    want = expected.found.step if expected.found else None
    result.check(f"resumed from the newest valid checkpoint on the shared claim (step {want}): "
                 f"step {restored}", want is not None and restored == want)
    result.check(f"the resumed segment completed at step {job.training.steps}",
                 bool(segments) and segments[-1].get("exit_reason") == "completed"
                 and segments[-1].get("end_step") == job.training.steps)
    return result


def _segments(runs_dir) -> list[dict]:
    from fm_pipeline.rundir.records import SEGMENTS_FILE, read_records

    return read_records(runs_dir / SEGMENTS_FILE, "segment") if runs_dir else []

