"""A rank slowed on purpose in a real torchrun run (FM_FAULT_SLOW_RANKS sleeps in its compute
section) is flagged within the detector's window, alone; the `exclude` policy checkpoints
and stops, and the next launch without its slot resumes resharded. Events reach the job's
event log, the API and MLflow; their cost is accounted."""

from __future__ import annotations

import pytest

from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.resilience.recovery import restored_step
from fm_pipeline.rundir.events import read_events
from fm_pipeline.stragglers.history import straggler_summary
from fm_pipeline.stragglers.mitigation import avoiding, plan_after_stragglers

SLOW_S = 0.3  # seconds of sleep per step in rank 1's compute section


@pytest.mark.slow
def test_a_slowed_rank_is_flagged_alone_then_excluded_and_the_job_resumes_without_it(
        chaos_ws, live_segment):
    ws = chaos_ws
    with ws.active():
        job = ws.job("straggle", **{"training.steps": 16, "training.segment_steps": 16,
                                    "checkpoint.every_steps": 4,
                                    "resilience.straggler_policy": "exclude"})
        ws.prepare(job)
        live = live_segment(job, env={"FM_FAULT_SLOW_RANKS": f"1:{SLOW_S}"})
        result = live.result()
        (segment,) = ws.segments(job.name)
        raised, _ = read_events(chaos_ws.site.runs_dir(job.name), kinds=("straggler",))
        ended, _ = read_events(chaos_ws.site.runs_dir(job.name), kinds=("straggler_end",))
        from fm_pipeline.api.progress import job_events

        api_kinds = [e["kind"] for e in job_events(chaos_ws.site.runs_dir(job.name))]
        summary = straggler_summary(job, chaos_ws.site.runs_dir(job.name))
        plan = plan_after_stragglers(job, chaos_ws.site.runs_dir(job.name))
        k8s = plan_after_stragglers(job, chaos_ws.site.runs_dir(job.name), target="kubernetes")

        # The detector: rank 1, its compute, within the window; nobody else.
        (event,) = raised
        r = job.resilience
        assert (event["rank"], event["section"], event["action"]) == (1, "compute", "exclude")
        # Slow from step 1; the first window also holds start-up (step 1 takes ~10x a
        # step), which inflates the noise scale: the bound is two windows from the start.
        assert event["detected_step"] <= 2 * r.straggler_window
        assert event["detected_step"] - event["first_step"] < r.straggler_window
        assert event["severity"] > 0.5 and event["gather_every"] == 1
        # The policy stopped the segment at the next step with a checkpoint (exit 75).
        assert result.outcome is Outcome.PREEMPTED
        assert segment["preempt_reason"].startswith("straggler: rank 1")
        stop = segment["end_step"]
        assert stop == event["detected_step"] + 1
        assert segment["checkpoint"].endswith(f"step-{stop:08d}")
        # Cost: the other rank idled ~SLOW_S per step while rank 1 was slow.
        (end,) = ended
        assert end["last_step"] == stop and end["recovered_step"] is None
        steps_slow = stop - end["first_step"] + 1
        idle_s = end["idle_gpu_hours"] * 3600
        assert 0.5 * SLOW_S * steps_slow < idle_s < 2 * SLOW_S * steps_slow
        assert end["idle_dollars"] == pytest.approx(
            end["idle_gpu_hours"] * job.cluster.price_per_gpu_hour, rel=1e-3, abs=1e-6)  # micro-$
        assert summary["idle_gpu_hours"] == pytest.approx(end["idle_gpu_hours"])
        assert "straggler" in api_kinds and "straggler_end" in api_kinds
        # Local mitigation: one rank fewer; Kubernetes: same size, the host avoided.
        assert plan.job.parallelism.world_size == 1 and plan.job.parallelism.resolved_dp_shard == 1
        assert k8s.job == job and k8s.avoid_hosts == (event["host"],)
        from fm_pipeline.launch.pod import Placement

        terms = avoiding(Placement(), k8s.avoid_hosts).affinity()["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [event["host"]]

        resumed = live_segment(plan.job, env={"FM_FAULT_SLOW_RANKS": f"1:{SLOW_S}"}).result()
        (_, after) = ws.segments(job.name)
    assert resumed.ok
    assert restored_step(after) == stop and after["resharded"] and after["world_size"] == 1
    assert after["end_step"] == 16


def test_straggler_events_reach_mlflow_as_tags_and_metrics(tmp_path):
    """StragglerWatch with the trainer's own MLflow sink on a sqlite store (rank 0's path),
    fed timings of a 4-rank job whose rank 2 computes 1.6x longer."""
    from fm_pipeline.data.testing import small_job
    from fm_pipeline.sim.rank_timings import SlowRank, synthetic_timings
    from fm_pipeline.stragglers.watch import StragglerWatch
    from fm_pipeline.tracking.runs import open_client
    from fm_pipeline.train.tracking import MlflowSink, TrainerTracking

    job = small_job(**{"name": "watched", "parallelism.nproc_per_node": 4})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MlflowSink(TrainerTracking(uri=uri), job_name=job.name,
                      params={"job": {"name": job.name}}, run_name="watched-0-40")
    watch = StragglerWatch.for_segment(job, segment="00000000-test", world_size=4,
                                       gather_every=1, mlflow=sink, runs=tmp_path / "runs")
    stops = [watch.update([vars(t) for t in gathered]) for gathered in synthetic_timings(
        n_ranks=4, steps=40, seed=5, slow=[SlowRank(rank=2, factor=1.6, from_step=10)])]
    watch.close(end_step=40)
    sink.close(summary={"start_step": 0, "end_step": 40, "exit_reason": "completed"},
               failed=False)
    run = open_client(uri).get_run(sink.run_id)
    assert not any(stops)  # policy "report": nobody is stopped
    assert run.data.tags["fm.straggler.1"].startswith("rank 2 (node-0000) compute +")
    assert run.data.tags["fm.straggler.1"].endswith(": reported")
    assert run.data.metrics["straggler.events"] == 1
    assert run.data.metrics["straggler.idle_gpu_hours"] > 0


@pytest.mark.slow
def test_under_drop_the_slowed_rank_computes_fewer_rows_and_the_job_never_stops(
        chaos_ws, live_segment):
    """`drop`: the same slowed rank (its delay scales with the rows it computes, as a slow
    device's would) is raised, computes 1 of its 4 rows from the next step, its peer waits
    far less, the job runs to its end without a stop, and the rows not computed are
    counted as lost tokens."""
    import statistics

    from fm_pipeline.rundir.records import RANK_TIMINGS_FILE, read_records

    ws = chaos_ws
    with ws.active():
        job = ws.job("dropper", **{"training.steps": 20, "training.segment_steps": 20,
                                   "training.micro_batch_size": 4,
                                   "checkpoint.every_steps": 100,
                                   "resilience.straggler_policy": "drop"})
        ws.prepare(job)
        result = live_segment(job, env={"FM_FAULT_SLOW_RANKS": f"1:{SLOW_S}"}).result()
        (segment,) = ws.segments(job.name)
        raised, _ = read_events(chaos_ws.site.runs_dir(job.name), kinds=("straggler",))
        (ended,), _ = read_events(chaos_ws.site.runs_dir(job.name), kinds=("straggler_drop_end",))
        timings = list(read_records(chaos_ws.site.runs_dir(job.name) / RANK_TIMINGS_FILE, "rank_timing"))
    assert result.ok and segment["end_step"] == 20 and not segment.get("preempt_reason")
    event = raised[0]
    assert (event["rank"], event["action"]) == (1, "drop")
    assert event["cost"]["rows_kept"] == 1 and event["cost"]["rows"] == 4
    assert event["cost"]["break_even_steps"] > 0
    detected = event["detected_step"]
    assert ended["why"] == "segment ended" and ended["since_step"] == detected
    # 3 of rank 1's 4 rows = 3/8 of the global batch, every step after the detection.
    per_step = job.tokens_per_step * 3 // 8
    assert ended["tokens_dropped"] == per_step * (20 - detected)
    fraction = {t["step"]: t["work_fraction"] for t in timings if t["rank"] == 1}
    assert fraction[detected] == 1.0 and fraction[detected + 2] == 0.25
    wait = {t["step"]: t["collective_wait_s"] for t in timings if t["rank"] == 0}
    before = statistics.median(wait[s] for s in range(2, detected + 1))
    after = statistics.median(wait[s] for s in range(detected + 2, 21))
    assert after < 0.6 * before, (before, after)
