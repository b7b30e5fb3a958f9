"""The sensors' decisions on real Dagster runs of training_segment_job, executed in process
with the LAUNCHER TEST DOUBLE and the sensors evaluated against the same instance
(driver.py)."""

from __future__ import annotations

import pytest
from dagster import AssetKey, RunRequest, SkipReason, build_sensor_context
from fm_pipeline.dagster_runs.names import (
    TAG_DECISION,
    TAG_DECISION_REASON,
    TAG_FAILED_AT,
    TAG_FAILURE,
    TAG_RESUME_AT,
)
from fm_pipeline.assets.training.sensors import checkpoint_evaluation_sensor
from fm_pipeline.dagster_runs.submit import first_segment_request
from fm_pipeline.resources.training_policy import TrainingPolicyResource

from fm_pipeline.definitions import defs
from tests.orchestration.conftest import job_spec
from tests.orchestration.driver import Pipeline, requests_of as _requests
from tests.orchestration.plans import FAULT, PLANS, SHAPE, planned_segments
from tests import local_site


def _segment(request: RunRequest) -> tuple[int, int]:
    return int(request.tags["fm/start_step"]), int(request.tags["fm/end_step"])


def test_failed_segment_resumes_from_the_newest_valid_checkpoint(instance):
    p = Pipeline(instance, job_spec("resume"), policy=TrainingPolicyResource(backoff_base_s=0))
    first = p.run(first_segment_request(p.job, store=p.store.open(), site=local_site.site()))
    assert first.success
    (nxt,) = _requests(p.progress())
    assert _segment(nxt) == (4, 8) and nxt.run_key == f"next-after-{first.run_id}"

    failed = p.run(nxt, fault="1:7")  # checkpoint at 6, then rank 1 dies after step 7
    assert not failed.success
    request = p.on_failure(failed)
    assert isinstance(request, RunRequest)
    assert request.tags["fm/resume_from"].endswith("step-00000006")
    assert _segment(request) == (6, 8) and request.partition_key == "resume"
    assert request.tags["fm/trigger"] == "resume_after_failure"
    assert request.run_key == f"resume-{failed.run_id}"
    tags = p.tags(failed)  # the failure and the decision, recorded on the failed run
    assert tags[TAG_DECISION] == "resumed" and tags[TAG_FAILED_AT] == "7"
    assert "InjectedFault: rank 1 fails after step 7" in tags[TAG_FAILURE]
    observed = instance.fetch_observations(AssetKey("training_segment"), limit=5).records
    assert observed and observed[0].partition_key == "resume"

    resumed = p.run(request)
    assert resumed.success
    (mat,) = resumed.asset_materializations_for_node("training_segment")
    assert mat.metadata["start_step"].value == 6 and mat.metadata["end_step"].value == 8
    assert "at its target step 8" in p.progress().skip_message  # the job is done


def test_the_dagster_path_launches_the_plans_the_local_orchestrator_launches(instance):
    """The job shape and planted fault of tests/api/test_local_orchestrator.py, carried by
    the sensors: the same plans, from plan_segment, carried in each run's config."""
    from fm_pipeline.orchestration.registry import plant_fault

    p = Pipeline(instance, job_spec("same-plans", **SHAPE),
                 policy=TrainingPolicyResource(backoff_base_s=0))
    plant_fault(p.store.open(), p.job.name, FAULT)
    request = first_segment_request(p.job, store=p.store.open(), site=local_site.site())
    for _ in range(len(PLANS)):
        config = request.run_config["ops"]["training_segment"]["config"]
        assert config["planned_start"] == "scratch" or config["planned_start"].endswith(
            f"step-{config['end_step'] - 2:08d}")  # the plan rides in the run config
        result = p.run(request)
        following = _requests(p.progress()) if result.success else [p.on_failure(result)]
        if not following:
            break
        request = following[0]
    assert "at its target step 6" in p.progress().skip_message
    assert planned_segments(p.job.name) == PLANS


def test_the_same_failure_at_the_same_step_twice_stops_the_job(instance):
    p = Pipeline(instance, job_spec("crash-loop"), policy=TrainingPolicyResource(backoff_base_s=0))
    p.run(first_segment_request(p.job, store=p.store.open(), site=local_site.site()))
    (nxt,) = _requests(p.progress())
    once = p.run(nxt, fault="1:5")
    retry = p.on_failure(once)
    assert isinstance(retry, RunRequest) and _segment(retry) == (4, 8)
    twice = p.run(retry, fault="1:5")  # the same bug hits again at step 5
    verdict = p.on_failure(twice)
    assert isinstance(verdict, SkipReason) and "crash loop" in verdict.skip_message
    tags = p.tags(twice)
    assert tags[TAG_DECISION] == "stopped" and "same failure at step 5 2 times" in \
        tags[TAG_DECISION_REASON]
    assert _requests(p.progress()) == []  # nothing restarts a stopped job


def test_backoff_delays_the_resume_until_it_has_passed(instance, monkeypatch):
    p = Pipeline(instance, job_spec("backoff"), policy=TrainingPolicyResource(backoff_base_s=600))
    failed = p.run(first_segment_request(p.job, store=p.store.open(), site=local_site.site()), fault="1:3")
    verdict = p.on_failure(failed)
    assert isinstance(verdict, SkipReason) and "backoff" in verdict.skip_message
    tags = p.tags(failed)
    ended = instance.get_run_record_by_id(failed.run_id).end_time
    assert tags[TAG_DECISION] == "resume_pending"
    assert float(tags[TAG_RESUME_AT]) == pytest.approx(ended + 600, abs=1)
    assert "resume in" in p.progress().skip_message  # still waiting

    import fm_pipeline.assets.training.sensors as sensors

    later = float(tags[TAG_RESUME_AT]) + 1
    monkeypatch.setattr(sensors.time, "time", lambda: later)
    (request,) = _requests(p.progress())
    assert _segment(request) == (2, 4)  # from the checkpoint at step 2
    assert request.tags["fm/resume_from"].endswith("step-00000002")
    assert p.tags(failed)[TAG_DECISION] == "resumed"
    assert _requests(p.progress()) == []  # requested once


def test_backoff_doubles_and_the_retry_budget_stops_the_job(instance):
    p = Pipeline(instance, job_spec("budget"), policy=TrainingPolicyResource(
        backoff_base_s=0.001, max_consecutive_failures=2))
    request = first_segment_request(p.job, store=p.store.open(), site=local_site.site())
    decisions = []
    for step in (1, 2, 3):  # different failures: not a crash loop
        failed = p.run(request, fault=f"1:{step}")
        outcome = p.on_failure(failed)
        decisions.append(p.tags(failed)[TAG_DECISION_REASON])
        if isinstance(outcome, SkipReason):
            break
        request = outcome
    assert "after 0 s" in decisions[0] and "failure 2 in a row" in decisions[1]
    assert "retry budget spent: 3 failures in a row (budget 2)" in decisions[2]


def test_preempted_segment_resumes_at_once_and_is_not_counted(instance):
    p = Pipeline(instance, job_spec("preempt"), policy=TrainingPolicyResource(
        backoff_base_s=600, max_consecutive_failures=0))
    preempted = p.run(first_segment_request(p.job, store=p.store.open(), site=local_site.site()), preempt_at=3)
    request = p.on_failure(preempted)
    assert isinstance(request, RunRequest), request
    assert request.tags["fm/trigger"] == "resume_after_preemption"
    assert _segment(request) == (3, 4) and request.tags["fm/resume_from"].endswith("step-00000003")


def test_every_new_checkpoint_is_evaluated_once(instance):
    """Once, and in one run per segment run: the checkpoints it recorded together."""
    p = Pipeline(instance, job_spec("evals"), policy=TrainingPolicyResource())
    p.run(first_segment_request(p.job, store=p.store.open(), site=local_site.site()))  # checkpoints at 2 and 4
    context = build_sensor_context(instance=instance, definitions=defs)
    first = checkpoint_evaluation_sensor(context)
    assert [(r.partition_key, r.tags["fm/checkpoint_steps"], r.tags["fm/checkpoint_step"],
             r.run_key) for r in first.run_requests] == [("evals", "2,4", "4",
                                                          "evaluate-evals-2+4")]
    again = checkpoint_evaluation_sensor(build_sensor_context(
        instance=instance, definitions=defs, cursor=first.cursor))
    assert isinstance(again, SkipReason)


def test_a_run_the_control_plane_stopped_is_left_to_it_and_api_tags_are_carried(instance):
    p = Pipeline(instance, job_spec("api-job"), policy=TrainingPolicyResource(backoff_base_s=0))
    api_tags = {"fm/api_job_id": "api-job", "fm/api_run": "1"}
    first = p.run(first_segment_request(p.job, store=p.store.open(), tags=api_tags, site=local_site.site()))
    (nxt,) = _requests(p.progress())
    assert {k: nxt.tags[k] for k in api_tags} == api_tags  # the next segment is the API run's
    failed = p.run(nxt, fault="1:5")
    resume = p.on_failure(failed)
    assert {k: resume.tags[k] for k in api_tags} == api_tags  # and so is the resume

    # Preempted by the control plane (fm/stop): no resume, no next segment from the sensors.
    instance.add_run_tags(first.run_id, {"fm/stop": "preempt"})
    preempted = p.run(resume, preempt_at=6)
    instance.add_run_tags(preempted.run_id, {"fm/stop": "preempt"})
    verdict = p.on_failure(preempted)
    assert isinstance(verdict, SkipReason) and "stopped by the control plane" in \
        verdict.skip_message
    assert p.tags(preempted)[TAG_DECISION] == "stopped"
    assert _requests(p.progress()) == []


def test_a_segment_refuses_a_resume_from_that_is_not_one_of_its_checkpoints(instance):
    p = Pipeline(instance, job_spec("bad-resume"), policy=TrainingPolicyResource())
    request = first_segment_request(p.job, store=p.store.open(), site=local_site.site())
    config = request.run_config["ops"]["training_segment"]["config"]
    config["resume_from"] = "/nowhere/step-00000002"
    failed = p.run(request)
    assert not failed.success
    (event,) = [e for e in failed.all_events if e.is_step_failure]
    failure = event.step_failure_data.user_failure_data
    assert failure.metadata["outcome"].value == "bad_config"
    assert "'/nowhere/step-00000002' is not a checkpoint of job bad-resume" in \
        failure.description


def test_the_drill_schedule_asks_once_for_a_checkpoint_whose_drill_is_still_queued(instance):
    """A drill queued behind the job's other runs when the next tick comes is not asked for
    again (a schedule's run key does not stop a second run across ticks, a sensor's does)."""
    from dagster import DagsterRunStatus, build_schedule_context

    from fm_pipeline.assets.training.schedules import restore_drill_schedule

    p = Pipeline(instance, job_spec("drilled"), policy=TrainingPolicyResource(backoff_base_s=0))
    assert p.run(first_segment_request(p.job, store=p.store.open(), site=local_site.site())).success
    (request,) = restore_drill_schedule(build_schedule_context(instance=instance))
    assert request.run_key.startswith("drill-drilled-")
    instance.create_run_for_job(defs.resolve_job_def("restore_drill_job"),
                                status=DagsterRunStatus.NOT_STARTED, tags={
                                    **request.tags, "dagster/run_key": request.run_key})
    again = restore_drill_schedule(build_schedule_context(instance=instance))
    assert isinstance(again, SkipReason) and "drill on its way" in again.skip_message
