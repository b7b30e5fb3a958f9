"""The pieces around the real runs: the event log a sensor tails, exclusions and the launch
they lead to, the straggler watch's policies, the fault table, the CLI, the S3 outage relay
and the namespace network (no torchrun here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fm_pipeline.cli.main import app
from fm_pipeline.data.testing import small_job
from fm_pipeline.resilience.matrix import FaultResult, render_table, run_fault
from fm_pipeline.rundir.events import append_event, events_path, read_events
from fm_pipeline.sim.rank_timings import SlowRank, synthetic_timings
from fm_pipeline.stragglers.history import straggler_summary
from fm_pipeline.stragglers.mitigation import excluded_slots, plan_after_stragglers
from fm_pipeline.stragglers.watch import StragglerWatch
from tests import local_site

runner = CliRunner()


def test_a_sensor_tailing_the_event_log_sees_each_complete_record_once():
    append_event(local_site.runs_dir("job-a"), "straggler", rank=1)
    with open(events_path(local_site.runs_dir("job-a")), "a") as f:
        f.write('{"kind": "straggler", "rank": 2')  # a record still being written
    first, cursor = read_events(local_site.runs_dir("job-a"), kinds=("straggler",))
    assert [r["rank"] for r in first] == [1] and first[0]["job"] == "job-a"
    with open(events_path(local_site.runs_dir("job-a")), "a") as f:
        f.write(', "time": 1}\n')
    append_event(local_site.runs_dir("job-a"), "fault_injected", fault="kill-rank")
    rest, cursor = read_events(local_site.runs_dir("job-a"), kinds=("straggler",), offset=cursor)
    assert [r["rank"] for r in rest] == [2]
    assert read_events(local_site.runs_dir("job-a"), offset=cursor) == ([], cursor)


def _exclude(job_name: str, *, host: str, local_rank: int, rank: int) -> None:
    append_event(local_site.runs_dir(job_name), "straggler", host=host, local_rank=local_rank, rank=rank,
                 section="compute", severity=0.4, first_step=10, action="exclude")


def test_local_exclusion_shrinks_dp_shard_and_kubernetes_avoids_the_host():
    job = small_job(**{"name": "tp-job", "parallelism.nproc_per_node": 4,
                       "parallelism.tp": 2, "model.n_heads": 4, "model.n_kv_heads": 2})
    assert plan_after_stragglers(job, local_site.runs_dir(job.name)).job == job  # nothing excluded yet
    _exclude("tp-job", host="node-a", local_rank=3, rank=3)
    plan = plan_after_stragglers(job, local_site.runs_dir(job.name))
    p = plan.job.parallelism
    # 3 ranks cannot hold tp 2: the largest layout that can is 2 ranks (dp_shard 1).
    assert (p.world_size, p.tp, p.resolved_dp_shard) == (2, 2, 1)
    assert plan.job.training.global_batch_size == job.training.global_batch_size
    assert "world size 4 -> 2" in plan.note and plan.env == {}
    k8s = plan_after_stragglers(job, local_site.runs_dir(job.name), target="kubernetes")
    assert k8s.job == job and k8s.avoid_hosts == ("node-a",)
    # The next JobSet (strictly validated) keeps its pods off the flagged node.
    from fm_pipeline.launch import KubernetesTarget, Placement, SegmentLaunch, render_segment
    from fm_pipeline.stragglers.mitigation import avoiding

    rendered = render_segment(SegmentLaunch(k8s.job, end_step=2), KubernetesTarget(
        store_uri="s3://bucket/fm", placement=avoiding(Placement(), k8s.avoid_hosts)))
    pod = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                         "values": ["node-a"]}]
    append_event(local_site.runs_dir("tp-job"), "exclusions_cleared")
    assert excluded_slots(local_site.runs_dir("tp-job")) == [] and plan_after_stragglers(job, local_site.runs_dir(job.name)).job == job


def test_each_launch_applies_the_exclusion_and_the_log_records_each_decision_once():
    from fm_pipeline.orchestration.segments import apply_exclusions

    job = small_job(**{"name": "once-job", "parallelism.nproc_per_node": 2})
    _exclude("once-job", host="node-a", local_rank=1, rank=1)
    plans = [apply_exclusions(job, local_site.runs_dir(job.name), "local") for _ in range(3)]  # three launches
    assert [p.job.parallelism.world_size for p in plans] == [1, 1, 1]
    (applied,), _ = read_events(local_site.runs_dir("once-job"), kinds=("exclusion_applied",))
    assert applied["world_size"] == 1 and applied["excluded"][0]["host"] == "node-a"
    _exclude("once-job", host="node-a", local_rank=0, rank=0)  # a new decision: recorded
    assert apply_exclusions(job, local_site.runs_dir(job.name), "local") is None and apply_exclusions(job, local_site.runs_dir(job.name), "local") is None
    events, _ = read_events(local_site.runs_dir("once-job"), kinds=("exclusion_applied",))
    assert len(events) == 2 and events[1]["note"].startswith("not applied")


def test_gpu_exclusion_names_the_devices_left_and_an_impossible_one_is_refused():
    gpu = small_job(**{"name": "gpu-job", "parallelism.nproc_per_node": 4,
                       "cluster.accelerator": "h100"})
    _exclude("gpu-job", host="node-a", local_rank=1, rank=1)
    # 3 ranks cannot split the global batch of 8: 2 ranks, on devices 0 and 2.
    assert plan_after_stragglers(gpu, local_site.runs_dir(gpu.name)).env == {"CUDA_VISIBLE_DEVICES": "0,2"}
    tight = small_job(**{"name": "tight", "parallelism.nproc_per_node": 2,
                         "parallelism.tp": 2, "model.n_heads": 4, "model.n_kv_heads": 2})
    _exclude("tight", host="node-a", local_rank=0, rank=0)
    with pytest.raises(ValueError, match="no smaller layout keeps tp 2"):
        plan_after_stragglers(tight, local_site.runs_dir(tight.name))


def _feed(watch: StragglerWatch, *, n_ranks: int, slow_rank: int, steps: int = 40):
    stops = []
    for gathered in synthetic_timings(n_ranks=n_ranks, steps=steps, seed=3,
                                      slow=[SlowRank(rank=slow_rank, factor=1.6)]):
        stops.append(watch.update([vars(t) for t in gathered]))
    watch.close(end_step=steps)
    return [s for s in stops if s]


def test_exclude_policy_asks_for_one_stop_and_refuses_what_the_layout_cannot_absorb():
    job = small_job(**{"name": "excl", "parallelism.nproc_per_node": 4,
                       "resilience.straggler_policy": "exclude"})
    watch = StragglerWatch.for_segment(job, segment="s1", world_size=4, gather_every=1, runs=local_site.runs_dir(job.name))
    (stop,) = _feed(watch, n_ranks=4, slow_rank=2)
    assert stop.startswith("straggler: rank 2 (node-0000) compute +")
    (raised,), _ = read_events(local_site.runs_dir("excl"), kinds=("straggler",))
    assert raised["action"] == "exclude" and raised["local_rank"] == 2

    tight = small_job(**{"name": "tight2", "parallelism.nproc_per_node": 2,
                         "parallelism.tp": 2, "model.n_heads": 4, "model.n_kv_heads": 2,
                         "resilience.straggler_policy": "exclude"})
    watch = StragglerWatch.for_segment(tight, segment="s1", world_size=2, gather_every=1, runs=local_site.runs_dir(tight.name))
    assert _feed(watch, n_ranks=2, slow_rank=1) == []  # keeps training
    (refused,), _ = read_events(local_site.runs_dir("tight2"), kinds=("straggler",))
    assert refused["action"] == "exclude_refused" and "tp 2" in refused["refused"]
    assert excluded_slots(local_site.runs_dir("tight2")) == []


def test_exclusions_expire_and_a_cleared_or_expired_slot_is_used_again():
    job = small_job(**{"name": "ttl-job", "parallelism.nproc_per_node": 2,
                       "resilience.exclusion_ttl_s": 60})
    _exclude("ttl-job", host="node-a", local_rank=1, rank=1)
    assert plan_after_stragglers(job, local_site.runs_dir(job.name)).job.parallelism.world_size == 1
    (slot,) = excluded_slots(local_site.runs_dir("ttl-job"), ttl_s=60)
    assert excluded_slots(local_site.runs_dir("ttl-job"), ttl_s=60, now=slot.time + 61) == []
    assert excluded_slots(local_site.runs_dir("ttl-job")) == [slot]  # no ttl: until cleared
    append_event(local_site.runs_dir("ttl-job"), "exclusions_cleared")
    assert plan_after_stragglers(job, local_site.runs_dir(job.name)).job == job


def test_past_its_budget_of_stops_exclude_reports_and_says_why():
    """max_straggler_stops counts segments stopped since the exclusions were cleared; a
    persistent straggler cannot stop and resume the job forever."""
    from fm_pipeline.stragglers.mitigation import straggler_stops

    job = small_job(**{"name": "budget", "parallelism.nproc_per_node": 4,
                       "resilience.straggler_policy": "exclude",
                       "resilience.max_straggler_stops": 1})
    first = StragglerWatch.for_segment(job, segment="s1", world_size=4, gather_every=1, runs=local_site.runs_dir(job.name))
    assert len(_feed(first, n_ranks=4, slow_rank=2)) == 1 and straggler_stops(local_site.runs_dir("budget")) == 1
    second = StragglerWatch.for_segment(job, segment="s2", world_size=4, gather_every=1, runs=local_site.runs_dir(job.name))
    assert _feed(second, n_ranks=4, slow_rank=2) == []  # reported, training goes on
    records, _ = read_events(local_site.runs_dir("budget"), kinds=("straggler",))
    assert [r["action"] for r in records] == ["exclude", "reported"]
    assert records[1]["budget_spent"] == ("1 straggler stop(s) of max_straggler_stops 1: "
                                          "reported only")
    append_event(local_site.runs_dir("budget"), "exclusions_cleared")  # the operator clears: the budget renews
    third = StragglerWatch.for_segment(job, segment="s3", world_size=4, gather_every=1, runs=local_site.runs_dir(job.name))
    assert len(_feed(third, n_ranks=4, slow_rank=2)) == 1


def test_straggler_costs_come_from_the_jobs_records():
    from fm_pipeline.orchestration.goodput import straggler_costs

    segments = [{"status": "FAILURE", "reason": "preempted at step 9 (straggler: rank 1 ...)",
                 "wall_s": 20.0},
                {"status": "SUCCESS", "reason": None, "wall_s": 30.0, "productive_s": 21.5},
                {"status": "FAILURE", "reason": "InjectedFault", "wall_s": 5.0}]
    ended = [{"idle_gpu_hours": 0.001}, {"idle_gpu_hours": 0.0005}]
    drops = [{"tokens_dropped": 1344, "drop_cost_gpu_s": 0.3},
             {"tokens_dropped": 256, "drop_cost_gpu_s": 0.05}]
    assert straggler_costs(segments, ended, drops) == {
        "stops": 1, "restart_s": 8.5, "idle_gpu_s": 5.4, "tokens_dropped": 1600,
        "drop_gpu_s": 0.35}


def test_policy_off_or_a_single_rank_watches_nothing():
    off = small_job(**{"name": "off", "resilience.straggler_policy": "off"})
    assert StragglerWatch.for_segment(off, segment="s", world_size=4, gather_every=1, runs=local_site.runs_dir(off.name)) is None
    assert StragglerWatch.for_segment(small_job(), segment="s", world_size=1,
                                      gather_every=1, runs=local_site.runs_dir(small_job().name)) is None


def test_straggler_summary_counts_each_event_once_with_its_final_cost():
    job = small_job(**{"name": "costly", "parallelism.nproc_per_node": 4})
    watch = StragglerWatch.for_segment(job, segment="s1", world_size=4, gather_every=10, runs=local_site.runs_dir(job.name))
    _feed(watch, n_ranks=4, slow_rank=1, steps=60)
    summary = straggler_summary(job, local_site.runs_dir(job.name))
    (event,) = summary["events"]
    assert event["kind"] == "straggler_end" and event["action"] == "reported"
    assert summary["idle_gpu_hours"] == pytest.approx(event["idle_gpu_hours"])
    assert event["idle_gpu_hours"] > 0
    assert summary["idle_dollars"] == pytest.approx(
        summary["idle_gpu_hours"] * job.cluster.price_per_gpu_hour)


def test_the_table_escapes_cells_and_a_fault_that_cannot_run_here_is_skipped(tmp_path,
                                                                             monkeypatch):
    done = FaultResult("x", injected="a | b", expected="e", outcome="o", steps_lost=2,
                       resume_s=3.25)
    done.check("held", True)
    table = render_table([done, FaultResult("y", skipped="needs root")])
    assert "| `x` | a \\| b | e | o | 2 | - | 3.2 s | pass |" in table
    assert "skipped: needs root" in table
    with pytest.raises(ValueError, match="unknown fault 'nope'"):
        run_fault(None, "nope")


def test_fault_figures_are_read_from_the_records_and_a_set_figure_is_caught(monkeypatch):
    # Segment "a" logs steps 1-4 and is killed after step 4; "b" restores step 2 and redoes
    # 3 and 4: two steps lost. Injection at t=104.5, end seen at 106.0, first step of "b"
    # at 112.0. A figure a scenario sets by hand disagrees with the records and is caught.
    from tests.local_site import runs_dir
    from fm_pipeline.rundir.records import METRICS_FILE
    from tests.resilience.records_check import assert_figures_agree

    runs = runs_dir("figures")
    runs.mkdir(parents=True)
    steps = [("a", s, 100.0 + s) for s in (1, 2, 3, 4)] + [
        ("b", s, 109.0 + s) for s in (3, 4, 5)]
    (runs / METRICS_FILE).write_text("".join(
        json.dumps({"kind": "step", "job": "figures", "segment": seg, "step": s, "time": t})
        + "\n" for seg, s, t in steps))
    clock = iter([104.5, 106.0])
    monkeypatch.setattr("fm_pipeline.rundir.events.time.time", lambda: next(clock))
    append_event(local_site.runs_dir("figures"), "fault_injected", fault="kill-rank")
    append_event(local_site.runs_dir("figures"), "segment_ended", exit_code=-9)
    hand_set = FaultResult("kill-rank", steps_lost=0, detect_s=1.5, resume_s=7.5)
    with pytest.raises(AssertionError, match="the records say 2, 1.5 s, 7.5 s"):
        assert_figures_agree(hand_set, runs)
    measured = FaultResult("kill-rank")
    measured.record_figures(runs)
    assert (measured.steps_lost, measured.detect_s, measured.resume_s) == (2, 1.5, 7.5)
    assert_figures_agree(measured, runs)
    # An operator's fix (a full disk freed): the resume is timed from it.
    clock = iter([110.0])
    append_event(local_site.runs_dir("figures"), "fault_cleared", fault="kill-rank")
    measured.record_figures(runs)
    assert measured.resume_s == 2.0
    assert_figures_agree(measured, runs)


def test_cli_lists_faults_and_rejects_unknown_ones_by_name():
    listed = runner.invoke(app, ["chaos", "list"])
    assert listed.exit_code == 0 and "hang-rank" in listed.output
    bad = runner.invoke(app, ["chaos", "run", "--faults", "kill-rank,nope",
                              "--out", os.devnull])
    assert bad.exit_code == 2 and "unknown fault(s) nope" in bad.output


@pytest.mark.slow
def test_chaos_run_writes_its_table_in_its_workspace_not_over_the_tracked_one(tmp_path):
    from tests.conftest import REPO

    tracked = REPO / "docs" / "fault-matrix.md"
    before = tracked.read_bytes()
    ran = runner.invoke(app, ["chaos", "run", "--faults", "bad-config",
                              "--home", str(tmp_path / "ws")])
    assert ran.exit_code == 0, ran.output
    table = (tmp_path / "ws" / "fault-matrix.md").read_text()
    assert "`bad-config`" in table and "Generated by `fm chaos run --faults bad-config`" in table
    assert tracked.read_bytes() == before


def test_cli_shows_a_jobs_stragglers_and_clears_its_exclusions(tmp_path):
    job_file = tmp_path / "job.yaml"
    import yaml

    from fm_pipeline.config import dump_job

    job = small_job(**{"name": "shown", "parallelism.nproc_per_node": 4})
    job_file.write_text(yaml.safe_dump(dump_job(job)))
    _exclude("shown", host="node-b", local_rank=1, rank=1)
    shown = runner.invoke(app, ["chaos", "stragglers", "--job", str(job_file)])
    assert shown.exit_code == 0 and "node-b" in shown.output and "exclude" in shown.output
    cleared = runner.invoke(app, ["chaos", "clear-exclusions", "--job", str(job_file)])
    assert cleared.exit_code == 0 and "cleared 1 exclusion" in cleared.output
    assert excluded_slots(local_site.runs_dir("shown")) == []


def test_the_s3_endpoint_dies_on_the_marked_request_and_comes_back_with_its_data():
    from fm_pipeline.resilience.s3_outage import OutageEndpoint
    from fm_pipeline.storage import StoreError

    with OutageEndpoint() as s3:
        s3.create_bucket("fm-unit")
        store = s3.store("fm-unit")
        store.put_bytes(b"kept", "a/one")
        s3.cut_when(b"step-00000004/")
        with pytest.raises(StoreError):
            store.put_bytes(b"x", "checkpoints/j/step-00000004/f")
        assert s3.down and b"step-00000004/f" in s3.cut_request
        with pytest.raises(StoreError):
            store.get_bytes("a/one")  # refused while down
        s3.restore()
        assert store.get_bytes("a/one") == b"kept"
        assert not store.exists("checkpoints/j/step-00000004/f")


def test_namespaced_nodes_reach_each_other_and_nothing_is_left_after_a_failure():
    from fm_pipeline.resilience.netns import NamespaceNetwork, availability, namespaces

    if why := availability():
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    server = ("import socket; s = socket.create_server(('{addr}', 29511)); "
              "c, _ = s.accept(); c.sendall(b'hello'); c.close()")
    client = ("import socket, time\nfor _ in range(50):\n    try:\n"
              "        print(socket.create_connection(('{addr}', 29511)).recv(5).decode()); break\n"
              "    except OSError: time.sleep(0.1)")
    with pytest.raises(RuntimeError, match="boom"):
        with NamespaceNetwork(2) as net:
            addr = net.nodes[0].address
            srv = subprocess.Popen(net.wrap(0, [sys.executable, "-c", server.format(addr=addr)]))
            out = subprocess.run(net.wrap(1, [sys.executable, "-c", client.format(addr=addr)]),
                                 capture_output=True, text=True, timeout=30)
            srv.wait(timeout=10)
            assert out.stdout.strip() == "hello"
            names = [n.namespace for n in net.nodes] + [net.switch]
            raise RuntimeError("boom")
    assert not set(names) & set(namespaces())


def test_events_are_plain_json_lines_the_api_lists():
    from fm_pipeline.api.progress import job_events

    append_event(local_site.runs_dir("api-job"), "straggler", rank=3, severity=0.25)
    (line,) = events_path(local_site.runs_dir("api-job")).read_text().splitlines()
    assert json.loads(line)["kind"] == "straggler"
    (event,) = job_events(local_site.runs_dir("api-job"))
    assert event["kind"] == "straggler" and event["detail"]["rank"] == 3
