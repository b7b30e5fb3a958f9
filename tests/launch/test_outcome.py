"""Reading a worker's real outcome from what torchrun and Kubernetes leave behind."""

from __future__ import annotations

import json

import pytest
from fm_pipeline.resources.launcher import launcher_from_env
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher
from fm_pipeline.resources.launcher_local import LocalLauncher

from fm_pipeline.launch.outcome import (
    Outcome,
    SegmentResult,
    diagnose,
    outcome_of,
    parse_error_record,
    parse_torchrun_summary,
)
from fm_pipeline.rundir.exit_record import exit_record

def _entry(index: int, rank: int, code: int, traceback: str, *, local_rank: int | None = None,
           signal: str = "", error_file: str = "<N/A>", host: str = "vm",
           time: str = "2026-12-01_20:51:07", pid: int | None = None) -> str:
    """One worker as torchrun's failure summary lists it."""
    name = f" ({signal})" if signal else ""
    return (f"[{index}]:\n  time      : {time}\n  host      : {host}\n"
            f"  rank      : {rank} (local_rank: {rank if local_rank is None else local_rank})\n"
            f"  exitcode  : {code} (pid: {pid or 24311 + rank}){name}\n  error_file: {error_file}\n"
            f"  traceback : {traceback}\n")


def _summary(root: str, *others: str) -> str:
    """torchrun's ChildFailedError summary: the other failures, then the root cause."""
    rule, heavy = "-" * 60 + "\n", "=" * 60 + "\n"
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + heavy +
            "fm_pipeline.train FAILED\n" + rule + "Failures:\n" +
            ("".join(others) if others else "  <NO_OTHER_FAILURES>\n") + rule +
            "Root Cause (first observed failure):\n" + root + heavy)


SUMMARY = _summary(
    _entry(0, 3, -9, "Signal 9 (SIGKILL) received by PID 11461", local_rank=1,
           signal="SIGKILL", host="node-b", time="2026-11-29_14:40:03", pid=11461),
    _entry(1, 0, -15, "Signal 15 (SIGTERM) received by PID 11460", signal="SIGTERM",
           host="node-a", time="2026-11-29_14:40:04", pid=11460))


def test_exit_codes_map_to_outcomes():
    assert [outcome_of(c) for c in (0, 75, 2, 1, -9, 137)] == [
        Outcome.SUCCEEDED, Outcome.PREEMPTED, Outcome.BAD_CONFIG, Outcome.FAILED,
        Outcome.KILLED, Outcome.KILLED]


def test_the_summary_root_cause_is_the_first_failure_not_the_first_listed():
    evidence = parse_torchrun_summary(SUMMARY, source="log")
    assert (evidence.rank, evidence.exit_code) == (3, -9)
    assert evidence.reason == "Signal 9 (SIGKILL) received by PID 11461"


def test_a_termination_message_cut_to_4_kib_keeps_code_and_reason():
    record = exit_record(75, "preempted at step 37; checkpoint step-00000037 saved",
                         traceback_text="x" * 5000)
    cut = json.dumps(record)[:300]  # Kubernetes keeps the head of the message
    evidence = parse_error_record(cut, source="message")
    assert evidence.exit_code == 75 and evidence.reason.startswith("preempted at step 37")
    assert len(record["message"]["extraInfo"]["py_callstack"]) == 2000


def test_diagnose_prefers_an_exit_code_and_fills_the_reason(tmp_path):
    worker = tmp_path / "torchrun" / "run_x" / "attempt_0" / "1"
    worker.mkdir(parents=True)
    (worker / "error.json").write_text(json.dumps(
        {"message": {"message": "RuntimeError: loss is NaN at step 12",
                     "extraInfo": {"py_callstack": "Traceback...", "timestamp": "1"}}}))
    output = SUMMARY.replace("-9 (pid: 11461) (SIGKILL)", "1 (pid: 11461)").replace(
        "  traceback : Signal 9 (SIGKILL) received by PID 11461",
        "  traceback : Traceback...\n  RuntimeError: loss is NaN at step 12")
    evidence = diagnose(log_dir=tmp_path / "torchrun", agent_error_file=None, output_text=output)
    assert evidence.exit_code == 1 and evidence.rank == 3
    assert evidence.reason == "RuntimeError: loss is NaN at step 12"


def test_results_round_trip_through_json():
    result = SegmentResult(job="j", end_step=20, outcome=Outcome.PREEMPTED, exit_code=75,
                           reason="preempted", torchrun_exit_code=1, duration_s=3.5,
                           failed_rank=0, error_files=("a/error.json",))
    assert SegmentResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_the_launcher_is_chosen_by_environment():
    assert isinstance(launcher_from_env({}), LocalLauncher)
    k8s = launcher_from_env({"FM_LAUNCHER": "kubernetes", "FM_STORE_URI": "s3://b/fm",
                             "FM_K8S_SHARED_CLAIM": "fm-runs", "FM_K8S_MAX_RESTARTS": "5"})
    assert isinstance(k8s, KubernetesLauncher)
    assert (k8s.shared_volume_claim, k8s.max_restarts) == ("fm-runs", 5)
    with pytest.raises(ValueError, match="needs FM_STORE_URI=s3://"):
        launcher_from_env({"FM_LAUNCHER": "kubernetes"})
    with pytest.raises(ValueError, match="expected one of local, kubernetes"):
        launcher_from_env({"FM_LAUNCHER": "slurm"})


def test_after_a_restart_the_last_report_of_an_asset_counts():
    from dagster import AssetKey, MaterializeResult
    from fm_pipeline.resources.launcher_results import SegmentRun

    class ReportedTwice:  # what a Pipes session holds after rank 0 reported from two pods
        def get_results(self):
            return [MaterializeResult(asset_key=AssetKey("segment"), metadata={"loss": 9.1}),
                    MaterializeResult(asset_key=AssetKey("segment"), metadata={"loss": 7.3})]

    result = SegmentResult(job="j", end_step=20, outcome=Outcome.SUCCEEDED, exit_code=0,
                           reason="reached end step", torchrun_exit_code=0, duration_s=1.0)
    run = SegmentRun(result=result, pipes=ReportedTwice())
    assert len(run.get_results()) == 1
    merged = run.materialize_result()
    assert merged.metadata["loss"] == 7.3 and merged.metadata["outcome"] == "succeeded"


def test_a_log_tail_without_torchruns_header_still_names_the_exception():
    from fm_pipeline.launch.k8s_follow import container_failure

    tail = "\n".join([f"    frame {i}" for i in range(70)] + [
        "  torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3",
        "  ", "=" * 60])
    evidence = container_failure("p", 1, tail)
    assert evidence.exit_code == 1
    assert evidence.reason == ("torch.distributed.DistBackendError: NCCL communicator was "
                               "aborted on rank 3")


def test_the_first_rank_to_exit_writes_the_pods_termination_message(tmp_path, monkeypatch):
    from fm_pipeline.config.worker_env import WorkerEnv
    from fm_pipeline.rundir.exit_record import write_exit_record

    message = tmp_path / "termination-log"
    message.write_text("")  # the kubelet creates it empty
    # what the pod tells each rank (launch/pod.py), as the worker's entry point reads it
    worker = WorkerEnv.from_environ({"FM_TERMINATION_LOG": str(message)})
    for rank, code in ((1, 75), (0, 1)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error{rank}.json"))
        write_exit_record(code, f"rank {rank} stopped", termination_log=worker.termination_log)
    evidence = parse_error_record(message.read_text(), source="message")
    assert (evidence.exit_code, evidence.rank, evidence.reason) == (75, 1, "rank 1 stopped")


PEER_LOSS_ROOT = _summary(
    _entry(0, 0, 1, "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error "
           "[127.0.0.1]:60119: Connection reset by peer. This is typically caused by a remote "
           "worker crashing.", error_file="/tmp/x/attempt_0/0/error.json"),
    _entry(1, 1, -9, "Signal 9 (SIGKILL) received by PID 24312"))


def test_a_peer_loss_root_cause_gives_way_to_the_worker_that_really_failed(tmp_path):
    """torchrun orders failures by whole seconds: the survivor's "connection reset by peer"
    can come first. The killed worker (in torchrun's list) or a worker's own error (its
    error file: a collective timeout) is the cause."""
    killed = diagnose(log_dir=None, agent_error_file=None, output_text=PEER_LOSS_ROOT)
    assert (killed.rank, killed.exit_code) == (1, -9)
    assert "SIGKILL" in killed.reason and outcome_of(killed.exit_code) is Outcome.KILLED

    # The hang: rank 1 was stopped, rank 0's collective timed out; woken, rank 1 fails on
    # the closed connection in the same second and torchrun names it.
    attempt = tmp_path / "run" / "attempt_0"
    for rank, reason, t in ((0, "RuntimeError: Timed out waiting 15000ms for send operation", 1),
                            (1, "RuntimeError: Connection closed by peer [127.0.0.1]:58507", 2)):
        (attempt / str(rank)).mkdir(parents=True)
        record = exit_record(1, reason)
        record["message"]["extraInfo"].update(rank=rank, time_ns=t)
        (attempt / str(rank) / "error.json").write_text(json.dumps(record))
    closed = ("  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 24312)\n"
              "  error_file: x\n  traceback : RuntimeError: Connection closed by peer "
              "[127.0.0.1]:58507\n")
    output = ("Failures:\n  <NO_OTHER_FAILURES>\n" + "-" * 60 +
              "\nRoot Cause (first observed failure):\n[0]:\n" + closed + "=" * 60 + "\n")
    hung = diagnose(log_dir=tmp_path, agent_error_file=None, output_text=output)
    assert (hung.rank, hung.exit_code) == (0, 1) and "Timed out" in hung.reason


TIMED_OUT = ("RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
             "15000ms for {} operation to complete")
TORN_DOWN_ROOT = _summary(
    _entry(0, 1, -15, TIMED_OUT.format("send"), error_file="/tmp/x/attempt_0/1/error.json",
           time="2026-12-02_05:22:08"),
    _entry(1, 0, 1, TIMED_OUT.format("recv"), error_file="/tmp/x/attempt_0/0/error.json",
           time="2026-12-02_05:22:09"))


def test_a_worker_torn_down_by_torchrun_gives_way_to_the_one_that_failed_on_its_own():
    """Seen in CI: the hung rank, woken, raised its own timeout and wrote its error file a
    moment before rank 0's; torchrun's SIGTERM then ended it (-15) and torchrun named it
    first. Rank 0 failed on its own (exit 1): the segment failed, nothing was killed."""
    evidence = diagnose(log_dir=None, agent_error_file=None, output_text=TORN_DOWN_ROOT)
    assert (evidence.rank, evidence.exit_code) == (0, 1)
    assert "Timed out" in evidence.reason and outcome_of(evidence.exit_code) is Outcome.FAILED
    # With no worker that failed on its own, a SIGTERM death stays what it was.
    alone = TORN_DOWN_ROOT.split("Root Cause")[0].replace("exitcode  : 1 ", "exitcode  : -15 ")
    alone += "Root Cause" + TORN_DOWN_ROOT.split("Root Cause")[1]
    assert diagnose(log_dir=None, agent_error_file=None, output_text=alone).exit_code == -15


def test_a_coordinated_stop_is_explained_by_rank_0s_record(tmp_path):
    """Every rank exits 75 after the all-reduced stop flag; torchrun may name any of them
    first, but only rank 0 knows why (here: the straggler policy's stop)."""
    attempt = tmp_path / "run" / "attempt_0"
    reasons = {0: "preempted at step 9 (straggler: rank 1 (vm) compute +333% per step; "
                  "excluding its slot); checkpoint step-00000009",
               1: "preempted at step 9; checkpoint step-00000009"}
    for rank, reason in reasons.items():
        (attempt / str(rank)).mkdir(parents=True)
        record = exit_record(75, reason)
        record["message"]["extraInfo"].update(rank=rank, time_ns=10 - rank)  # rank 1 first
        (attempt / str(rank) / "error.json").write_text(json.dumps(record))
    evidence = diagnose(log_dir=tmp_path, agent_error_file=None, output_text=None)
    assert evidence.exit_code == 75 and "straggler: rank 1" in evidence.reason
