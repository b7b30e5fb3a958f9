"""The trainer's rank 0 reporting into the orchestrator's runs on a real MLflow server: a
2-rank torchrun segment logs every step into the segment run the resource created, and a
second segment started with only the parent run id creates its own child under the job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fm_pipeline.resources.mlflow import MlflowTrackingResource

from fm_pipeline.config import dump_job
from tests.local_site import runs_dir
from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.rundir.records import METRICS_FILE, SEGMENTS_FILE, read_records
from fm_pipeline.tracking import names
from tests.conftest import REPO
from tests import local_site

pytestmark = [pytest.mark.server, pytest.mark.slow]

JOB = {"name": "tracked", "parallelism.nproc_per_node": 2, "training.steps": 4,
       "training.segment_steps": 2, "training.lr": 1e-2, "training.warmup_steps": 1,
       "checkpoint.every_steps": 2, "checkpoint.upload": False}


def _train(job_file: Path, fm_home: Path, *, nproc: int | None, end_step: int,
           mlflow_env: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FM_", "MLFLOW_", "DAGSTER_PIPES_", "TORCHELASTIC_"))}
    env.update(FM_HOME=str(fm_home), OMP_NUM_THREADS="1", **mlflow_env)
    target = ["-m", "fm_pipeline.train", "--job", str(job_file), "--end-step", str(end_step)]
    launcher = [sys.executable] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}"]
    out = subprocess.run([*launcher, *target], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]


def test_rank0_logs_each_step_into_the_segment_runs_of_its_job(mlflow_server, experiment,
                                                               fm_home, tmp_path):
    job = small_job(**JOB)
    build_small_mix(job, store=local_site.site().store())
    job_file = tmp_path / "tracked.yaml"
    spec = dump_job(job)
    spec["parallelism"]["dp_shard"] = -1  # follow the world size: segment 2 runs on 1 rank
    job_file.write_text(yaml.safe_dump(spec))
    mlflow = MlflowTrackingResource(tracking_uri=mlflow_server, experiment=experiment)

    # Segment 1, as the orchestrator runs it: its run is created first, rank 0 logs into it,
    # the orchestrator ends it with the outcome and the trainer's summary.
    seg1 = mlflow.start_segment_run(job, segment="to-2", end_step=2, dagster_run_id="dag-1")
    _train(job_file, fm_home, nproc=2, end_step=2, mlflow_env=mlflow.trainer_env(seg1))
    (summary,) = read_records(runs_dir(job.name) / SEGMENTS_FILE, "segment")
    mlflow.finish_segment(seg1, outcome="succeeded", summary=summary)

    # Segment 2, a trainer started by hand with only the job's parent run: it finds the
    # experiment from the parent and creates (and ends) its own segment run under it.
    parent = mlflow.job_run(job)
    _train(job_file, fm_home, nproc=None, end_step=4, mlflow_env={
        names.ENV_URI: mlflow_server, names.ENV_PARENT_RUN_ID: parent})

    client = mlflow.tracker().client
    steps = read_records(runs_dir(job.name) / METRICS_FILE, "step")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    losses = {r["step"]: r["loss"] for r in steps}
    run1 = client.get_run(seg1)
    assert run1.info.status == "FINISHED"
    assert run1.data.tags[names.TAG_PARENT] == parent
    assert run1.data.tags[names.TAG_DAGSTER_RUN] == "dag-1"
    assert run1.data.tags[names.TAG_CHECKPOINT_URI].endswith("step-00000002")
    assert run1.data.params["job.name"] == "tracked"  # the trainer's effective spec
    assert run1.data.params["plan.world_size"] == "2"
    history = client.get_metric_history(seg1, "loss")
    assert sorted(m.step for m in history) == [1, 2]  # one point per step: rank 0 only
    assert {m.step: m.value for m in history} == pytest.approx({1: losses[1], 2: losses[2]})
    assert {m.step for m in client.get_metric_history(seg1, "tokens_per_s")} == {1, 2}

    seg2 = [r for r in mlflow.tracker().segment_runs("tracked") if r.info.run_id != seg1]
    (run2,) = seg2
    assert run2.info.status == "FINISHED" and run2.data.tags[names.TAG_PARENT] == parent
    assert run2.data.tags[names.TAG_KIND] == "segment"
    assert run2.data.params["plan.world_size"] == "1"
    assert {m.step: m.value for m in client.get_metric_history(
        run2.info.run_id, "loss")} == pytest.approx({3: losses[3], 4: losses[4]})

    # The parent carries the job spec and, from finished segments, the loss curve.
    p = client.get_run(parent)
    assert p.data.params["job.training.steps"] == "4"
    assert p.data.tags["fm.checkpoint.00000002"] == run1.data.tags[names.TAG_CHECKPOINT_URI]
    assert {m.step for m in client.get_metric_history(parent, "loss")} == {1, 2}
    if os.environ.get("FM_DOCS_SCREENSHOTS") == "1":
        _docs_screenshot(f"{mlflow_server}/#/experiments/{p.info.experiment_id}/runs/{parent}",
                         tmp_path)


def _docs_screenshot(page: str, tmp_path: Path) -> None:
    """docs/img/mlflow-job-run.png: the job's parent run with its segment runs and tags."""
    import shutil

    from tests.ui.browser import HeadlessChromium

    with HeadlessChromium(shutil.which("chromium"), profile=tmp_path / "chromium") as browser:
        browser.open(page)
        browser.wait_for_text(lambda t: "tracked-to-2" in t and "fm.checkpoint" in t,
                              timeout_s=60)
        browser.evaluate("document.querySelector('button[aria-label=\"Close\"]')?.click()")
        time.sleep(1)  # the assistant panel slides away
        browser.screenshot(REPO / "docs" / "img" / "mlflow-job-run.png")
