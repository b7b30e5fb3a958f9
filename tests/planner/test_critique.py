"""The critique of what a job spec declares: every finding at once, each with its numbers,
and following the suggestions leaves nothing to say."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from fm_pipeline.cli.k8s import app as k8s_app
from fm_pipeline.cli.plan import app as plan_app
from fm_pipeline.config import load_job, parse_job
from fm_pipeline.defaults import DEMO_JOB
from fm_pipeline.planner.job_plan import job_critique, plan_for_job


def seed_job(**sections) -> dict:
    """The seed's job: fm-100b on 2,048 H100s as tp 8 x pp 16 x dp 16, a save every 500
    steps, 20-step segments, the default 25 s grace period, fp32 declared."""
    spec = yaml.safe_load(DEMO_JOB.read_text())
    spec.update(
        name="fm-100b", model={"size": "fm-100b"},
        parallelism={"nnodes": 256, "nproc_per_node": 8, "tp": 8, "pp": 16, "dp_shard": 16,
                     "mixed_precision": "fp32"},
        training={"seq_len": 8192, "global_batch_size": 512, "micro_batch_size": 1,
                  "steps": 100_000, "segment_steps": 20},
        checkpoint={"every_steps": 500}, cluster={"accelerator": "h100"})
    for section, values in sections.items():
        spec[section] = {**spec[section], **values}
    return spec


def test_the_seed_job_is_critiqued_with_numbers_on_every_count():
    findings = {f.field: f for f in job_critique(parse_job(seed_job()))}
    assert set(findings) == {"parallelism.mixed_precision", "checkpoint.every_steps",
                             "training.segment_steps", "training.preemption_grace_s"}
    interval = findings["checkpoint.every_steps"]
    assert "every 500 steps" in interval.message and "goodput" in interval.message
    assert "GPU-hours a day" in interval.message and 1 <= interval.suggested < 500
    assert "tokens/s" in findings["parallelism.mixed_precision"].message
    assert findings["parallelism.mixed_precision"].suggested == "bf16"
    segment = findings["training.segment_steps"]
    assert "relaunch" in segment.message and segment.suggested > 20
    grace = findings["training.preemption_grace_s"]
    assert "GB written" in grace.message and grace.suggested > 25


def test_following_the_suggestions_leaves_nothing_to_say():
    # Each fix can move the others (bf16 halves the step, so the interval and the segment
    # are re-derived): applying all suggestions settles within a few rounds.
    spec = seed_job()
    for _ in range(3):
        findings = job_critique(parse_job(spec))
        if not findings:
            break
        for f in findings:
            section, key = f.field.split(".")
            value = float(f.suggested) if key == "preemption_grace_s" else f.suggested
            spec[section] = {**spec[section], key: value}
    assert findings == []


def test_the_demo_has_nothing_to_critique_and_its_plan_says_so():
    job = load_job(DEMO_JOB)
    assert job_critique(job) == []
    assert plan_for_job(job)["critique"] == []


def test_render_and_estimate_print_the_critique(tmp_path):
    spec = tmp_path / "seed.yaml"
    spec.write_text(yaml.safe_dump(seed_job()))
    out = tmp_path / "manifests"
    rendered = CliRunner().invoke(k8s_app, ["render", "--job", str(spec), "--out", str(out),
                                            "--store-uri", "s3://fm-test/runs"])
    assert rendered.exit_code == 0, rendered.output
    warned = [line for line in rendered.output.splitlines() if line.startswith("warning:")]
    assert {w.split(":")[1].strip() for w in warned} == {
        "parallelism.mixed_precision", "checkpoint.every_steps", "training.segment_steps",
        "training.preemption_grace_s"}
    est = CliRunner().invoke(plan_app, ["estimate", "--job", str(spec), "--json"])
    assert est.exit_code == 0, est.output
    critique = json.loads(est.stdout)["critique"]
    assert [c["field"] for c in critique][1] == "checkpoint.every_steps"


@pytest.mark.parametrize("every", [1, 2])
def test_an_interval_shorter_than_the_write_is_called_a_backlog(every):
    findings = {f.field: f for f in job_critique(parse_job(seed_job(
        parallelism={"mixed_precision": "bf16"}, checkpoint={"every_steps": every})))}
    assert "writes nonstop" in findings["checkpoint.every_steps"].message
