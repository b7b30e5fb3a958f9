"""In-job restart from the fast tier (real torchrun, 2 ranks, one node): a worker killed
mid-segment is restarted in place by torchrun's elastic agent (--max-restarts), every rank
restores the newest in-memory snapshot, and the segment trains on to its end step: no new
launch, at most one fast interval redone, and the weights bitwise those of a run that was
never interrupted. A corrupt own copy falls back to the durable tier with the reason; a
deliberate stop (the flag file) is not restarted."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from fm_pipeline.api.progress import job_events
from fm_pipeline.checkpoint import load_full_state
from fm_pipeline.config.worker_env import FAST_DIR_ENV
from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.rundir.events import read_events

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]

STEPS = 10
FAST = {"training.steps": STEPS, "training.segment_steps": STEPS,
        "checkpoint.every_steps": STEPS, "checkpoint.memory_every_steps": 2,
        "resilience.inplace_restarts": 1}


@pytest.fixture
def fast_dir(tmp_path, monkeypatch):
    path = tmp_path / "shm"
    monkeypatch.setenv(FAST_DIR_ENV, str(path))
    return path


def _final_state(ws, name):
    return load_full_state(ws.checkpoint_dir(name, STEPS), keys={"model", "optimizer"})


def test_a_killed_worker_restarts_in_place_from_memory_and_matches_the_straight_run(
        chaos_ws, live_segment, fast_dir):
    with chaos_ws.active():
        straight = chaos_ws.job("straight", **FAST)
        chaos_ws.prepare(straight)
        result = live_segment(straight).result()
        assert result.outcome == Outcome.SUCCEEDED, result.reason

        job = chaos_ws.job("killed", **FAST)
        live = live_segment(job)
        live.wait_for_step(5)
        live.signal_rank(1, signal.SIGKILL)
        result = live.result()
        assert result.outcome == Outcome.SUCCEEDED, result.reason
        # One launch; each attempt's rank 0 leaves its record: the torn-down one, then the
        # restarted one.
        killed, segment = chaos_ws.segments("killed")
        assert (killed["attempt"], killed["exit_reason"]) == (0, "failed")
        assert killed["worker_pid"] != segment["worker_pid"]  # torchrun's new workers
        restart = segment["inplace_restart"]
        assert not restart["in_process"]
        assert segment["attempt"] == 1 and restart["tier"] == "memory", restart
        assert restart["restored_step"] in (4, 6), restart
        assert restart["steps_redone"] <= 2, restart  # at most one fast interval
        assert restart["restored_step"] + restart["steps_redone"] >= killed["end_step"]
        assert "without an error record" in restart["cause"]
        assert segment["end_step"] == STEPS and segment["restored_tier"] == "memory"
        events, _ = read_events(chaos_ws.site.runs_dir("killed"), kinds=("inplace_restart",))
        assert [e["restored_step"] for e in events] == [restart["restored_step"]]
        # What GET /v1/training/jobs/{id} counts as inplace_restarts, and lists as events.
        assert [e["kind"] for e in job_events(chaos_ws.site.runs_dir("killed"))].count("inplace_restart") == 1
        a, b = _final_state(chaos_ws, "straight"), _final_state(chaos_ws, "killed")
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key
        # A clean end frees the memory: the next segment restores from the durable tier.
        assert not any(fast_dir.rglob("*.snap"))


def test_a_failure_that_leaves_every_process_alive_restarts_in_the_processes(
        chaos_ws, live_segment, fast_dir):
    """Rank 1 raises after step 5 (FM_FAULT_FAIL_AT): rank 0's collective fails on the closed
    connection, both tear their groups down, meet again on the store and run the segment on
    in the same processes (train/inprocess.py): no new worker, the newest snapshot restored,
    the weights bitwise those of an uninterrupted run."""
    with chaos_ws.active():
        straight = chaos_ws.job("straight-inproc", **FAST)
        chaos_ws.prepare(straight)
        assert live_segment(straight).result().outcome == Outcome.SUCCEEDED

        job = chaos_ws.job("inproc", **FAST)
        result = live_segment(job, env={"FM_FAULT_FAIL_AT": "1:5"}).result()
        assert result.outcome == Outcome.SUCCEEDED, result.reason
        failed, segment = chaos_ws.segments("inproc")
        assert failed["exit_reason"] == "failed"  # rank 0's record: its peer went away
        assert failed["worker_pid"] == segment["worker_pid"]  # the same process
        restart = segment["inplace_restart"]
        assert restart["in_process"] and restart["tier"] == "memory", restart
        assert restart["cause"].startswith("rank 1: InjectedFault"), restart["cause"]
        assert restart["restored_step"] in (4, 5) and restart["steps_redone"] <= 2, restart
        assert segment["attempt"] == 1 and segment["end_step"] == STEPS
        a, b = _final_state(chaos_ws, "straight-inproc"), _final_state(chaos_ws, "inproc")
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key

        # Switched off, the same fault is torchrun's: new worker processes.
        job = chaos_ws.job("inproc-off", **FAST, **{"resilience.inprocess_restart": False})
        result = live_segment(job, env={"FM_FAULT_FAIL_AT": "1:5"}).result()
        assert result.outcome == Outcome.SUCCEEDED, result.reason
        failed, segment = chaos_ws.segments("inproc-off")
        assert failed["worker_pid"] != segment["worker_pid"]
        assert not segment["inplace_restart"]["in_process"]


def test_a_corrupt_fast_copy_falls_back_to_the_durable_tier_with_the_reason(
        chaos_ws, live_segment, fast_dir):
    """Both workers frozen (SIGSTOP) after step 6, every snapshot of rank 1 flipped, rank 1
    killed: the restart finds no step rank 1 can load from memory (one node: no replica),
    says why, and restores the durable checkpoint of step 4 instead."""
    from fm_pipeline.resilience.injectors import flip_byte

    with chaos_ws.active():
        job = chaos_ws.job("corrupt-fast", **{**FAST, "checkpoint.every_steps": 4})
        chaos_ws.prepare(job)
        live = live_segment(job)
        live.wait_for_step(6)  # frozen at 6 or 7: before the durable save of step 8
        workers = live.workers()
        for pid in workers.values():
            os.kill(pid, signal.SIGSTOP)
        flipped = [flip_byte(p) for p in sorted(fast_dir.rglob("own/rank-00001/*.snap"))]
        assert flipped
        os.kill(workers[1], signal.SIGKILL)
        os.kill(workers[0], signal.SIGCONT)
        result = live.result()
        assert result.outcome == Outcome.SUCCEEDED, result.reason
        segment = chaos_ws.segments("corrupt-fast")[-1]
        restart = segment["inplace_restart"]
        assert restart["tier"] == "local" and restart["restored_step"] == 4, restart
        assert any("CRC32C mismatch" in line for line in restart["skipped"]), restart
        assert segment["end_step"] == STEPS


def test_a_deliberate_stop_is_not_restarted_in_place(chaos_ws, live_segment, fast_dir):
    """The flag file stops the segment with a checkpoint (75); torchrun would restart the
    workers on any non-zero exit: they end the same way at once, and the launch is
    preempted, not trained on."""
    from fm_pipeline.launch.local import preempt_running_segments

    with chaos_ws.active():
        job = chaos_ws.job("stopped", **FAST)
        chaos_ws.prepare(job)
        live = live_segment(job)
        live.wait_for_step(3)
        preempt_running_segments(chaos_ws.site.runs_dir(job.name))
        result = live.result()
        assert result.outcome == Outcome.PREEMPTED, result.reason
        assert "not restarted" in result.reason
        assert [s["attempt"] for s in chaos_ws.segments("stopped")] == [0]


def test_through_dagster_pipes_the_restart_is_in_the_materialization(chaos_ws, fast_dir,
                                                                    monkeypatch):
    """The local launcher under Dagster: rank 1 raises after step 5 (FM_FAULT_FAIL_AT, once
    per segment), torchrun restarts both workers, and the one materialization of the step
    carries the restart: count, cause, tier, restore time, steps redone."""
    from dagster import asset, materialize
    from fm_pipeline.resources.launcher_local import LocalLauncher

    # The launcher resource is an entry point: its Site comes from this process's environment.
    monkeypatch.setenv("FM_HOME", str(chaos_ws.home))
    with chaos_ws.active():
        job = chaos_ws.job("piped", **FAST)
        chaos_ws.prepare(job)

        @asset
        def segment(context):
            run = LocalLauncher(echo_output=False).launch_segment(
                context, job=job, end_step=STEPS, env={"FM_FAULT_FAIL_AT": "1:5"})
            return run.materialize_result()

        result = materialize([segment])
        assert result.success
        (mat,) = result.asset_materializations_for_node("segment")
        metadata = {k: v.value for k, v in mat.metadata.items()}
        assert metadata["outcome"] == "succeeded" and metadata["end_step"] == STEPS
        assert metadata["inplace_restarts"] == 1 and metadata["restored_tier"] == "memory"
        assert "InjectedFault" in metadata["inplace_cause"], metadata
        assert metadata["inplace_steps_redone"] <= 2 and metadata["inplace_restore_s"] > 0
