"""Each fault class injected into a real 2-rank torchrun run of the debug model, in its
cheapest real form: one job lives through a chain of faults, every launch resuming the
previous fault and hosting the next (the full matrix, one job per fault with the table, is
`fm chaos run`).

    launch 1  SIGKILL rank 1 after checkpoint 4            -> killed, reason recorded
              flip a byte in the newest checkpoint
    launch 2  resumes from the one before it; SIGTERM      -> preempted (75) at step s
    launch 3  resumes from s exactly; SIGSTOP rank 1       -> collective timeout
    launch 4  resumes, trains to step 30                   -> completed; no straggler
    launch 5  --set training.lr=-1                         -> exit 2, nothing touched
    launch 6  a corrupted shard                            -> exit 2 naming it, not retried
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import pytest

from fm_pipeline.config import dump_job, parse_job
from fm_pipeline.launch.outcome import Outcome, SegmentResult
from fm_pipeline.resilience import injectors
from fm_pipeline.resilience.recovery import decide, restored_step
from fm_pipeline.rundir.events import read_events
from fm_pipeline.stragglers.history import scan_rank_timings

pytestmark = pytest.mark.slow

STEPS = 30
TIMEOUT_S = 15


@dataclass
class Link:
    result: SegmentResult
    segment: dict  # the launch's segments.jsonl record ({} if rank 0 wrote none)
    last_step: int | None
    facts: dict = field(default_factory=dict)


def _link(ws, live, result) -> Link:
    with ws.active():
        records = ws.segments(live.launch.job.name, since=live.started_at)
        steps = live.steps()
    return Link(result, records[-1] if records else {},
                max((r["step"] for r in steps), default=None))


@pytest.fixture(scope="module")
def chain(chaos_ws):
    from fm_pipeline.launch.spec import SegmentLaunch
    from fm_pipeline.resilience.processes import LiveSegment

    ws = chaos_ws
    links: dict[str, Link] = {}
    with ws.active():
        job = ws.job("chain", **{"training.steps": STEPS, "training.segment_steps": STEPS,
                                 "checkpoint.keep_last": 10, "checkpoint.async_save": False,
                                 "resilience.collective_timeout_s": TIMEOUT_S})
        mix = ws.prepare(job)
        started: list[LiveSegment] = []

        def start() -> LiveSegment:
            live = LiveSegment(SegmentLaunch(job, end_step=STEPS), timeout_s=300, site=chaos_ws.site).start()
            started.append(live)
            return live

        try:
            live = start()  # 1: kill a rank
            live.wait_for_step(5)
            live.wait_for_checkpoint(4)
            live.signal_rank(1, signal.SIGKILL)
            links["kill"] = _link(ws, live, live.result())
            newest, _ = ws.newest_valid(job)
            victim = injectors.checkpoint_victim(ws.checkpoint_dir(job.name, newest))
            injectors.flip_byte(victim)
            _, skipped = ws.newest_valid(job)
            links["kill"].facts.update(corrupted=newest, victim=victim.name, skipped=skipped)

            live = start()  # 2: resume past the corruption, then preempt
            live.wait_for_step(newest + 1)
            live.preempt()
            links["preempt"] = _link(ws, live, live.result())

            live = start()  # 3: resume from the stop step, then hang a rank
            first = live.wait_for_step(links["preempt"].last_step + 1)
            hung_at = time.time()
            live.signal_rank(1, signal.SIGSTOP)
            while live.running and not ws.segments(job.name, since=live.started_at):
                time.sleep(0.1)  # rank 0 writes its "failed" record when the timeout fires
            failed_at = time.time()
            # Wake the stopped rank: it dies on the lost peer at once, instead of torchrun
            # waiting its fixed 30 s before SIGKILL (fm chaos run measures that wait).
            for pid in live.workers(expect=1, timeout_s=1).values():
                _wake(pid)
            links["hang"] = _link(ws, live, live.result())
            newest_valid, _ = ws.newest_valid(job)
            links["hang"].facts.update(detected_s=failed_at - hung_at, first=first,
                                       newest_valid=newest_valid)

            live = start()  # 4: resume to the end
            links["final"] = _link(ws, live, live.result())
        finally:
            for live in started:
                live.cleanup()
    return ws, job, mix, links


def _wake(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def test_a_killed_rank_is_named_in_the_failure_record(chain):
    _, _, _, links = chain
    kill = links["kill"]
    assert kill.result.outcome in (Outcome.KILLED, Outcome.FAILED), kill.result
    # torchrun's root cause is its first observed failure, by the second: rank 0's error on
    # losing its peer can come first; the launcher names the killed rank all the same.
    reason = kill.result.reason
    assert kill.result.failed_rank == 1 and "SIGKILL" in reason, reason
    assert kill.last_step is not None and kill.last_step >= 5


def test_a_corrupt_newest_checkpoint_is_rejected_and_the_previous_one_restored(chain):
    _, _, _, links = chain
    facts = links["kill"].facts
    corrupted = facts["corrupted"]
    assert corrupted >= 4
    (reason,) = [line for line in facts["skipped"] if f"step-{corrupted:08d}" in line]
    assert facts["victim"] in reason and "CRC32C mismatch" in reason
    resumed = links["preempt"].segment
    assert restored_step(resumed) == corrupted - 2  # never the corrupt one


def test_preemption_commits_the_stop_step_and_the_next_launch_loses_nothing(chain):
    ws, job, _, links = chain
    preempt = links["preempt"]
    assert preempt.result.outcome is Outcome.PREEMPTED and preempt.result.exit_code == 75
    stop = preempt.segment["end_step"]
    assert preempt.segment["checkpoint"].endswith(f"step-{stop:08d}")
    assert restored_step(links["hang"].segment) == stop == preempt.last_step


def test_a_hung_rank_fails_the_segment_within_the_collective_timeout(chain):
    ws, job, _, links = chain
    hang = links["hang"]
    assert hang.result.outcome is Outcome.FAILED
    assert "Timed out" in hang.result.reason, hang.result.reason
    assert hang.segment["exit_reason"] == "failed"
    # The timeout plus rank 0's reporting, not torch's default 30 minutes.
    assert TIMEOUT_S - 1 <= hang.facts["detected_s"] <= TIMEOUT_S + 20


def test_the_job_resumes_to_its_end_and_clean_steps_raise_no_straggler(chain):
    ws, job, _, links = chain
    final = links["final"]
    assert final.result.ok and final.segment["end_step"] == STEPS
    assert restored_step(final.segment) == links["hang"].facts["newest_valid"] is not None
    with ws.active():
        assert read_events(ws.site.runs_dir(job.name), kinds=("straggler",))[0] == []
        scanned = scan_rank_timings(ws.site.runs_dir(job.name))
    # Every launch of the chain is a separate detector run; the last one has > 20 samples.
    assert len(scanned) == 4 and not any(scanned.values()), scanned


def test_a_bad_config_exits_2_naming_the_field_and_touches_no_checkpoint(chain, live_segment):
    ws, job, _, _ = chain
    with ws.active():
        before = {p: p.read_bytes() for p in ws.checkpoint_dir(job.name, 0).parent.glob(
            "step-*/manifest.json")}
        live = live_segment(job, overrides=["training.lr=-1"])
        result = live.result()
        decision, _ = decide(result, failed_at_step=None, start_step=STEPS)
        after = {p: p.read_bytes() for p in before}
    assert result.outcome is Outcome.BAD_CONFIG and result.exit_code == 2
    assert "training.lr" in result.reason and "greater than 0" in result.reason
    assert not live.steps()
    assert after == before and len(before) >= 3
    if decision.source == "orchestration policy":
        assert not decision.resume and "bad config" in decision.reason


def test_a_corrupt_shard_is_a_permanent_failure_naming_it_and_is_not_retried(chain,
                                                                             live_segment):
    ws, job, mix, _ = chain
    longer = parse_job({**dump_job(job), "training": {**dump_job(job)["training"],
                                                      "steps": STEPS + 2}})
    with ws.active():
        path, _ = injectors.corrupt_shard(ws.store_dir, mix,
                                          sample=STEPS * job.training.global_batch_size)
        try:
            result = live_segment(longer).result()
        finally:
            injectors.flip_byte(path)
        decision, _ = decide(result, failed_at_step=STEPS, start_step=STEPS)
    key = path.relative_to(ws.store_dir).as_posix()
    assert result.outcome is Outcome.BAD_CONFIG and result.exit_code == 2
    assert result.reason.startswith("CorruptShardError") and key in result.reason
    if decision.source == "orchestration policy":
        assert not decision.resume and "retrying cannot fix it" in decision.reason
