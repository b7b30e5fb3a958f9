"""The run model through a real MLflow server on loopback: one parent run per training job,
child runs for segments, evaluations and drills, found again by tags from a fresh client."""

from __future__ import annotations

import math

import pytest
from fm_pipeline.resources.mlflow import MlflowTrackingResource

from fm_pipeline.data.testing import small_job
from fm_pipeline.planner.job_plan import plan_for_job
from fm_pipeline.tracking import names, runs

pytestmark = pytest.mark.server


def test_job_segments_evaluations_and_drills_nest_under_one_parent(mlflow_server, experiment):
    job = small_job(name="nest", tenant="vision")
    mlflow = MlflowTrackingResource(tracking_uri=mlflow_server, experiment=experiment)
    parent = mlflow.job_run(job)
    mlflow.log_plan(job, plan_for_job(job))
    seg = mlflow.start_segment_run(job, segment="to-2", end_step=2, dagster_run_id="dagster-a")
    runs.log_metrics(mlflow.tracker().client, seg, {"loss": 3.0}, step=1)  # as rank 0 does
    runs.log_metrics(mlflow.tracker().client, seg, {"loss": 2.5}, step=2)
    # A retried Dagster step finds its segment run again; another Dagster run gets its own.
    assert mlflow.start_segment_run(job, segment="to-2", end_step=2,
                                    dagster_run_id="dagster-a") == seg
    seg_b = mlflow.start_segment_run(job, segment="to-4", end_step=4, dagster_run_id="dagster-b")
    assert seg_b != seg
    ckpt = "s3://ckpt/checkpoints/nest/step-00000002"
    mlflow.finish_segment(seg, outcome="succeeded", summary={
        "start_step": 0, "end_step": 2, "mfu": 0.31, "goodput": 0.9, "checkpoint": ckpt})
    mlflow.finish_segment(seg_b, outcome="failed", failure_reason="rank 1: CUDA error")
    # Dagster retries the step of seg: same run, a new attempt logs step 2 again.
    assert mlflow.start_segment_run(job, segment="to-2", end_step=2,
                                    dagster_run_id="dagster-a") == seg
    runs.log_metrics(mlflow.tracker().client, seg, {"loss": 2.25}, step=2)
    mlflow.finish_segment(seg, outcome="succeeded", summary={"start_step": 1, "end_step": 2})
    ev = mlflow.log_evaluation(job, checkpoint_step=2, checkpoint_uri=ckpt,
                               metrics={"prose.loss": 3.5, "prose.perplexity": 33.1},
                               dagster_run_id="dagster-c")
    drill = mlflow.log_drill(job, checkpoint_step=2, checkpoint_uri=ckpt, passed=False,
                             metrics={"restore_s": 1.5}, params={"topology": {"dp_shard": 1}},
                             failure_reason="loss differs by 0.2", dagster_run_id="dagster-d")

    # Everything below through a new tracker: found by tags, not remembered ids.
    tracker = MlflowTrackingResource(tracking_uri=mlflow_server, experiment=experiment).tracker()
    client = tracker.client
    assert tracker.job_run(job) == parent
    p = client.get_run(parent)
    assert p.info.run_name == "nest" and p.info.status == "RUNNING"
    assert p.data.tags[names.TAG_KIND] == "job" and p.data.tags[names.TAG_TENANT] == "vision"
    assert p.data.params["job.name"] == "nest"
    assert p.data.params["job.training.segment_steps"] == "2"
    assert float(p.data.params["plan.estimate.mfu"]) > 0
    assert p.data.tags["fm.checkpoint.00000002"] == ckpt
    assert p.data.metrics["eval.prose.perplexity"] == pytest.approx(33.1)
    # Every point of both attempts once, none of the retry's copy repeated.
    assert sorted((m.step, m.value) for m in client.get_metric_history(parent, "loss")) == [
        (1, 3.0), (2, 2.25), (2, 2.5)]
    assert {a.path for a in client.list_artifacts(parent)} == {"job.json", "plan.json"}

    children = {r.info.run_id: r for r in client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")}
    assert set(children) == {seg, seg_b, ev, drill}
    s = children[seg]
    assert s.info.status == "FINISHED" and s.info.run_name == "nest-to-2"
    assert s.data.tags[names.TAG_DAGSTER_RUN] == "dagster-a"
    assert s.data.tags[names.TAG_SEGMENT] == "to-2" and s.data.tags[names.TAG_JOB] == "nest"
    assert s.data.tags[names.TAG_CHECKPOINT_URI] == ckpt
    assert [(m.step, m.value) for m in client.get_metric_history(seg, "segment.mfu")] == [
        (2, pytest.approx(0.31))]
    b = children[seg_b]
    assert b.info.status == "FAILED" and b.data.tags[names.TAG_FAILURE] == "rank 1: CUDA error"
    e = children[ev]
    assert e.info.status == "FINISHED" and e.data.tags[names.TAG_KIND] == "evaluation"
    assert e.data.params["checkpoint.uri"] == ckpt
    assert [(m.step, m.value) for m in client.get_metric_history(ev, "prose.loss")] == [
        (2, pytest.approx(3.5))]
    d = children[drill]
    assert d.info.status == "FAILED" and d.data.tags[names.TAG_DRILL_PASSED] == "false"
    assert d.data.params["topology.dp_shard"] == "1"
    assert d.data.tags[names.TAG_DAGSTER_RUN] == "dagster-d"
    assert [r.info.run_id for r in tracker.segment_runs("nest")] == [seg, seg_b]

    mlflow.finish_job(job)
    assert client.get_run(parent).info.status == "FINISHED"
    # Training the job again reopens its run rather than starting a second parent.
    mlflow.start_segment_run(job, segment="to-6", end_step=6, dagster_run_id="dagster-e")
    assert client.get_run(parent).info.status == "RUNNING"
    assert len(tracker_runs(tracker, kind="job")) == 1


def tracker_runs(tracker, *, kind: str):
    return tracker.client.search_runs([tracker.experiment_id],
                                      filter_string=f"tags.`fm.kind` = '{kind}'")


def test_two_jobs_keep_separate_parents_and_bad_calls_name_the_problem(mlflow_server, experiment,
                                                                      monkeypatch):
    mlflow = MlflowTrackingResource(tracking_uri=mlflow_server, experiment=experiment)
    a, b = small_job(name="job-a"), small_job(name="job-b")
    assert mlflow.job_run(a) != mlflow.job_run(b)
    with pytest.raises(ValueError, match="no MLflow run for job 'job-c'"):
        mlflow.finish_job(small_job(name="job-c"))
    with pytest.raises(ValueError, match="run status must be one of"):
        mlflow.finish_job(a, status="DONE")
    parent = mlflow.job_run(a)
    # A diverged evaluation is recorded as such, not dropped.
    ev = mlflow.log_evaluation(a, checkpoint_step=8, checkpoint_uri="/c/step-00000008",
                               metrics={"code.loss": float("nan"), "ok": True})
    (point,) = mlflow.tracker().client.get_metric_history(ev, "code.loss")
    assert point.step == 8 and math.isnan(point.value)
    assert "ok" not in mlflow.tracker().client.get_run(ev).data.metrics
    assert mlflow.run_url(parent).startswith(f"{mlflow_server}/#/experiments/")
    monkeypatch.setenv(names.ENV_UI_URL, "http://127.0.0.1:5999/")  # what `make ui` sets
    assert mlflow.run_url(parent).startswith("http://127.0.0.1:5999/#/experiments/")
    assert mlflow.run_url(parent).endswith(f"/runs/{parent}")
