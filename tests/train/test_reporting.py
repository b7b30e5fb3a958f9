"""A 4-rank checkpoint resumed in one plain python process (no torchrun), reporting to MLflow
(a sqlite tracking store) and to Dagster Pipes as the orchestrator would read them."""

from __future__ import annotations

import pytest

from tests.train.launch import env_for, failure, train, write_job
from tests.train.pipes import pipes_env, read_messages
from tests.train.test_resume import REFERENCE, _assert_continues

pytestmark = pytest.mark.slow


def test_four_ranks_to_one_process_with_mlflow_and_pipes(layouts_run, tmp_path):
    ws = layouts_run
    pipes, messages = pipes_env(tmp_path)
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = env_for(ws.home, FM_MLFLOW_URI=db, FM_MLFLOW_EXPERIMENT="trainer-test", **pipes)
    job = write_job(ws.jobs, "single-from-fsdp4", nproc=1,
                    **{"parallelism.dp_shard": 1, "training.rank_timings_every": 1})
    out = train(ws.home, job, "--resume-from", str(ws.checkpoint(REFERENCE, 6)), env=env)
    assert out.returncode == 0, failure(out)
    _assert_continues(ws, "single-from-fsdp4", source=REFERENCE, from_step=6, end_step=8)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=db)
    (run,) = client.search_runs([client.get_experiment_by_name("trainer-test").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["job.name"] == "single-from-fsdp4"
    assert run.data.params["plan.world_size"] == "1"
    assert int(run.data.params["plan.flops_per_token"]) > 0
    losses = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert losses == pytest.approx({r["step"]: r["loss"] for r in ws.metrics("single-from-fsdp4")})
    assert {m.step for m in client.get_metric_history(run.info.run_id, "mfu")} == {7, 8}

    got = read_messages(messages)
    methods = [m["method"] for m in got]
    assert methods[0] == "opened" and methods[-1] == "closed"
    (materialization,) = [m for m in got if m["method"] == "report_asset_materialization"]
    meta = materialization["params"]["metadata"]
    assert meta["start_step"]["raw_value"] == 6 and meta["end_step"]["raw_value"] == 8
    assert meta["exit_reason"]["raw_value"] == "completed"
    assert meta["checkpoint"]["raw_value"].endswith("step-00000008")
    (custom,) = [m for m in got if m["method"] == "report_custom_message"]
    assert custom["params"]["payload"]["segment"]["final_loss"] == pytest.approx(
        ws.metrics("single-from-fsdp4")[-1]["loss"])


def test_an_unreachable_mlflow_server_is_a_warning_not_a_four_minute_stall(tmp_path, caplog,
                                                                             monkeypatch):
    import socket

    from fm_pipeline.train.reporter import SegmentReporter
    from fm_pipeline.train.tracking import TrainerTracking

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    reporter = SegmentReporter(job_name="j", runs_dir=tmp_path, params={}, start_step=0,
                               target_step=2, tracking=TrainerTracking(uri=dead))
    assert reporter.mlflow.ready.wait(30) and not reporter.mlflow.usable
    reporter.mlflow.log_metrics(1, {"loss": 1.0})  # dropped, not raised
    reporter.mlflow.close(summary={}, failed=False)
    assert f"MLflow at {dead} unusable" in caplog.text
    assert "no answer from the MLflow server" in caplog.text
