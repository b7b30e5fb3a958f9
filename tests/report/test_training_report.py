"""`fm report JOB`: the figure and summary of a job's run directory.

The run directory is written the way the trainer writes it (its JsonLines writer, its
segment ids, its segments.jsonl records; checkpoints with a manifest and the evaluation's
`eval` mark): launch 1 trains 0->20, launch 2 resumes at 20 and fails after step 35,
launch 3 resumes from the checkpoint at 30 (steps 31-35 are lost) and is preempted after
step 45 with a checkpoint of it, launch 4 resumes at 45 and completes step 50.
"""

from __future__ import annotations

import math

import pytest
from PIL import Image
from typer.testing import CliRunner

from fm_pipeline.catalog.marks import write_mark
from fm_pipeline.catalog.refs import MANIFEST, CheckpointRef
from fm_pipeline.cli.main import app
from tests.local_site import runs_dir
from fm_pipeline.eval.result import DomainLoss, EvalResult
from fm_pipeline.report import NoMetrics, read_run_history
from fm_pipeline.rundir.records import METRICS_FILE, SEGMENTS_FILE, JsonLines
from tests import local_site

JOB = "plotted"
EVERY = 10  # checkpoint.every_steps
# (start step, last step reached, exit reason, exit code)
LAUNCHES = [(0, 20, "completed", 0), (20, 35, "failed", 1), (30, 45, "preempted", 75),
            (45, 50, "completed", 0)]


def loss_at(step: int, launch: int) -> float:
    return 8.0 * math.exp(-step / 40) + 0.01 * launch  # each launch's curve distinguishable


def write_run(job: str = JOB, *, with_segment_records: bool = True) -> None:
    directory = runs_dir(job)
    for i, (start, end, reason, code) in enumerate(LAUNCHES):
        common = {"job": job, "segment": f"{start:08d}-launch{i}"}
        metrics = JsonLines(directory / METRICS_FILE, **common)
        for step in range(start + 1, end + 1):
            saved = step % EVERY == 0 or (reason == "preempted" and step == end)
            step_time = 1.2 if step == start + 1 else 0.4  # warm-up step
            metrics.write("step", step=step, loss=loss_at(step, i), grad_norm=0.5, lr=1e-3,
                          step_time_s=step_time, tokens=2048, tokens_seen=2048 * step,
                          tokens_per_s=2048 / step_time, mfu=0.05 / step_time,
                          data_wait_s=0.001, checkpoint_block_s=0.05 if saved else 0.0,
                          peak_memory_gib=None, process_cpu_s=0.2)
        metrics.close()
        if with_segment_records:
            segments = JsonLines(directory / SEGMENTS_FILE, **common)
            segments.write("segment", start_step=start, end_step=end, target_step=50,
                           exit_code=code, exit_reason=reason,
                           error="InjectedFault: rank 1 after step 35" if code == 1 else None,
                           final_loss=loss_at(end, i), wall_s=8.0)
            segments.close()
    for step in (30, 40, 45, 50):  # retention removed 10 and 20
        ref = CheckpointRef.local(directory / "checkpoints" / f"step-{step:08d}")
        ref.dir.mkdir(parents=True)
        (ref.dir / MANIFEST).write_text("{}")
        if step in (30, 40):
            result = EvalResult(job=job, step=step, checkpoint=str(ref.dir), domains={
                "code": DomainLoss(loss=7.0 - step / 20, tokens=4096, batches=8),
                "prose": DomainLoss(loss=7.5 - step / 25, tokens=2048, batches=4)})
            write_mark(ref, "eval", result.to_dict())


def test_report_writes_the_figure_and_a_summary_with_the_lost_work():
    write_run()
    out = CliRunner().invoke(app, ["report", JOB])
    assert out.exit_code == 0, out.output
    figure = runs_dir(JOB) / "training.png"
    assert f"figure: {figure}" in out.output.replace("\n", "")
    with Image.open(figure) as image:
        assert image.format == "PNG"
        width, height = image.size
        assert width >= 800 and height >= 700  # five panels a person can read
        assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50  # not blank
    text = " ".join(out.output.split())
    assert "step 50/50 in 4 launches (1 failed, 1 preempted)" in text
    assert f"final loss {loss_at(50, 3):.4f}" in text
    assert "median step time 0.400 s" in text
    assert "MFU 12.5%" in text
    assert "5,120 tokens/s" in text
    assert "lost steps 5" in text  # 31-35, redone after the failure; the preemption lost none
    assert "evaluated: 30, 40" in text


def test_history_keeps_the_latest_launch_of_each_step_and_fades_the_redone_ones():
    write_run()
    history = read_run_history(JOB, directory=local_site.runs_dir(JOB))
    kept = history.kept()
    assert [r["step"] for r in kept] == list(range(1, 51))
    assert kept[32]["segment"] == "00000030-launch2"  # step 33: the resumed launch's record
    failed = history.launches[1]
    assert (failed.outcome, failed.end_step) == ("failed", 35)
    assert [r["step"] for r in history.lost(failed)] == [31, 32, 33, 34, 35]
    assert history.lost(history.launches[2]) == []  # preempted with a checkpoint of step 45
    checkpoints = {c.step: c for c in history.checkpoints}
    assert sorted(checkpoints) == [10, 20, 30, 40, 45, 50]
    assert not checkpoints[10].committed and checkpoints[30].committed
    assert checkpoints[40].heldout() == pytest.approx(
        {"code": 5.0, "prose": 5.9, "all domains": (5.0 * 4096 + 5.9 * 2048) / 6144})


def test_a_killed_launch_without_its_segment_record_still_counts_its_lost_steps(tmp_path):
    write_run(with_segment_records=False)  # e.g. SIGKILLed ranks: only metrics.jsonl
    history = read_run_history(JOB, directory=local_site.runs_dir(JOB))
    assert history.lost_steps == 5
    assert history.launches[1].outcome == "no end record"
    out = CliRunner().invoke(app, ["report", JOB, "--out", str(tmp_path / "x" / "run.png")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "x" / "run.png").stat().st_size > 10_000


def test_a_job_without_metrics_is_a_clear_error():
    out = CliRunner().invoke(app, ["report", "never-ran"])
    assert out.exit_code == 2
    assert "job 'never-ran' has no training metrics" in " ".join(out.output.split())
    assert not (runs_dir("never-ran") / "training.png").exists()
    with pytest.raises(NoMetrics, match="never-ran"):
        read_run_history("never-ran", directory=local_site.runs_dir("never-ran"))


def test_the_initial_models_evaluation_starts_the_heldout_curve_at_step_0(tmp_path):
    from fm_pipeline.cli.report import write_report

    write_run()
    baseline = EvalResult(job=JOB, step=0, checkpoint=None, domains={
        "code": DomainLoss(loss=8.1, tokens=4096, batches=8),
        "prose": DomainLoss(loss=8.0, tokens=2048, batches=4)})
    path = write_report(JOB, out=tmp_path / "with-init.png", baseline=baseline, quiet=True, site=local_site.site())
    assert path.stat().st_size > 10_000
    history = read_run_history(JOB, directory=local_site.runs_dir(JOB))
    history.baseline = baseline.to_dict()
    assert [c.step for c in history.evaluations()] == [0, 30, 40]
    assert history.evaluations()[0].heldout()["code"] == 8.1
