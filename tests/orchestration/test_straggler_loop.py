"""The straggler loop closed on a real deployment (the instance's dagster.yaml and a real
`dagster-daemon`; real torchrun segments of two ranks). Rank 1 is slowed on purpose
(FM_FAULT_SLOW_RANKS sleeps in its compute section) under the `exclude` policy:

- detected within the detector's window; the segment stops once, with a checkpoint (75);
- the daemon's failure sensor resumes it (a preemption: not counted as a failure), and the
  segment asset launches it without the slot: world 1, resharded from the stop's checkpoint,
  to the target; the decision is in the segment's metadata, the job's event log (the API's
  events) and its MLflow run; the job report charges the stop and the idle time to
  stragglers;
- with the budget of straggler stops spent (max_straggler_stops 0) the same straggler is
  reported, not excluded, and the job trains to its target on its full world;
- a persistent straggler (rank 1 slow on every layout) in a 4-rank job with a budget of one
  stop: stopped once, resumed on the largest world the batch accepts (2), slow there too,
  reported with the budget spent, and trained to its target on 2 ranks.
"""

from __future__ import annotations

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterRunStatus, RunsFilter
from fm_pipeline.dagster_runs.names import SEGMENT_JOB
from fm_pipeline.dagster_runs.submit import register_training_job
from fm_pipeline.dagster_runs.summary import job_report
from rich.progress import Progress

from fm_pipeline.cli.follow import RunFollower
from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.orchestration.submissions import submit_run
from fm_pipeline.resilience.workspace import CHAOS_JOB
from fm_pipeline.rundir.events import read_events
from fm_pipeline.storage import open_store
from fm_pipeline.stragglers.mitigation import straggler_stops
from tests.deploy.stack import deployment, use_home
from tests import local_site

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]
STEPS = 16
# The persistent job must still have a detector's window of steps left on the smaller world
# however late the first detection comes (4 ranks on 2 cores detect later than 2 ranks).
PERSISTENT_STEPS = 24
SLOW_S = 0.3  # rank 1 sleeps this long per step in its compute section


def straggling_job(name: str, **overrides):
    return small_job(**{**CHAOS_JOB, "name": name, "training.steps": STEPS,
                        "training.segment_steps": STEPS, "checkpoint.every_steps": 4,
                        "resilience.straggler_policy": "exclude", **overrides})


def segment_runs(instance, name: str) -> list:
    return list(reversed(instance.get_runs(filters=RunsFilter(
        job_name=SEGMENT_JOB, tags={"dagster/partition": name}))))


def materializations(instance, name: str) -> list[dict]:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("training_segment"), asset_partitions=[name]),
        limit=10, ascending=True).records
    return [{k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
            for r in records]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Both jobs, one after the other (never sharing the cores: a straggler by contention
    would be real), through one deployment; yields (home, instance)."""
    home = tmp_path_factory.mktemp("straggler-loop")
    store_dir = home / "store"
    with pytest.MonkeyPatch.context() as mp:
        use_home(mp, home)
        store = open_store(str(store_dir))
        env = {"FM_STORE_URI": str(store_dir), "FM_RETRY_BACKOFF_S": "0.5",
               "FM_FAULT_SLOW_RANKS": f"1:{SLOW_S}"}
        jobs = [straggling_job("excluded"),
                straggling_job("budget-spent", **{"resilience.max_straggler_stops": 0}),
                straggling_job("persistent", **{"parallelism.nproc_per_node": 4,
                                                "training.steps": PERSISTENT_STEPS,
                                                "training.segment_steps": PERSISTENT_STEPS,
                                                "resilience.max_straggler_stops": 1})]
        build_small_mix(jobs[0], store=store)
        with deployment(home, env=env) as stack:
            for job in jobs:
                register_training_job(stack.instance, job, store=store)
                submit_run(store, job)
                RunFollower(Progress(disable=True), stack.instance, job.name,
                            target_step=job.training.steps).wait_for_target(api_run=1, timeout_s=600)
            yield home, stack.instance


@pytest.fixture
def at_home(ran, monkeypatch):
    """The module's FM_HOME (each test otherwise gets its own): the job's event log."""
    home, instance = ran
    use_home(monkeypatch, home)
    return home, instance


def test_a_straggler_is_stopped_once_and_the_job_resumes_without_its_slot(at_home):
    home, instance = at_home
    name = "excluded"
    stopped, resumed = segment_runs(instance, name)
    assert stopped.status == DagsterRunStatus.FAILURE
    assert stopped.tags["fm/outcome"] == "preempted" and stopped.tags["fm/decision"] == "resumed"
    assert "straggler: rank 1" in stopped.tags["fm/failure"]
    assert resumed.tags["fm/trigger"] == "resume_after_preemption"
    assert resumed.tags["dagster/sensor_name"] in ("segment_failure_sensor",
                                                   "segment_progress_sensor")
    assert resumed.status == DagsterRunStatus.SUCCESS

    (raised,), _ = read_events(local_site.runs_dir(name), kinds=("straggler",))
    assert (raised["rank"], raised["action"]) == (1, "exclude")
    window = straggling_job(name).resilience.straggler_window
    assert raised["detected_step"] - raised["first_step"] < window
    assert straggler_stops(local_site.runs_dir(name)) == 1
    (applied,), _ = read_events(local_site.runs_dir(name), kinds=("exclusion_applied",))
    assert (applied["world_size_before"], applied["world_size"]) == (2, 1)
    assert [s["rank"] for s in applied["excluded"]] == [1]

    (segment,) = materializations(instance, name)  # the stopped launch recorded none
    stop = int(resumed.tags["fm/start_step"])
    assert segment["world_size"] == 1 and segment["resharded"] is True
    assert segment["restored_from"].endswith(f"step-{stop:08d}")
    assert segment["launched_world_size"] == 1 and segment["end_step"] == STEPS
    assert "world size 2 -> 1" in segment["straggler_action"]
    assert raised["host"] in segment["stragglers_excluded"]

    from fm_pipeline.tracking import JobTracker

    tracker = JobTracker(f"sqlite:///{home / 'mlflow.db'}")
    tags = [r.data.tags for r in tracker.segment_runs(name)]
    assert [t.get("fm.straggler_exclusion", "") for t in tags if t["fm.outcome"] ==
            "succeeded"] == [segment["straggler_action"]]

    report = job_report(instance, name, runs=local_site.runs_dir(name))
    assert report.reached_step == STEPS
    costs = report.stragglers
    assert costs["stops"] == 1 and costs["restart_s"] > 0
    steps_slow = raised["detected_step"] - raised["first_step"] + 1
    assert costs["idle_gpu_s"] > 0.5 * SLOW_S * steps_slow


def test_with_the_stop_budget_spent_the_straggler_is_reported_and_training_goes_on(at_home):
    _, instance = at_home
    name = "budget-spent"
    (only,) = segment_runs(instance, name)
    assert only.status == DagsterRunStatus.SUCCESS
    raised, _ = read_events(local_site.runs_dir(name), kinds=("straggler",))
    assert raised and all(r["action"] == "reported" for r in raised)
    assert "max_straggler_stops 0: reported only" in raised[0]["budget_spent"]
    assert read_events(local_site.runs_dir(name), kinds=("exclusion_applied",))[0] == []
    (segment,) = materializations(instance, name)
    assert segment["world_size"] == 2 and segment["end_step"] == STEPS
    assert job_report(instance, name, runs=local_site.runs_dir(name)).stragglers["stops"] == 0


def test_a_persistent_straggler_stops_the_job_at_most_its_budget_then_is_reported(at_home):
    _, instance = at_home
    name = "persistent"
    runs = segment_runs(instance, name)
    assert [r.status for r in runs] == [DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS]
    assert runs[0].tags["fm/outcome"] == "preempted"
    assert straggler_stops(local_site.runs_dir(name)) == 1  # the budget, not more
    raised, _ = read_events(local_site.runs_dir(name), kinds=("straggler",))
    first = [r for r in raised if r["world_size"] == 4]
    then = [r for r in raised if r["world_size"] == 2]
    assert first[0]["action"] == "exclude"
    # On the smaller world the slow rank is raised again: the budget is spent, so it is
    # reported and the job trains on.
    stop = int(runs[1].tags["fm/start_step"])
    assert then, f"not raised on world 2 in steps {stop}..{PERSISTENT_STEPS}: {raised}"
    assert all(r["action"] == "reported" for r in then)
    assert "1 straggler stop(s) of max_straggler_stops 1: reported only" in \
        then[0]["budget_spent"]
    (applied,), _ = read_events(local_site.runs_dir(name), kinds=("exclusion_applied",))
    assert (applied["world_size_before"], applied["world_size"]) == (4, 2)
    (segment,) = materializations(instance, name)
    assert segment["world_size"] == 2 and segment["end_step"] == PERSISTENT_STEPS
    assert segment["resharded"] is True
    report = job_report(instance, name, runs=local_site.runs_dir(name))
    assert report.reached_step == PERSISTENT_STEPS and report.stragglers["stops"] == 1
