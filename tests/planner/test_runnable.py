"""Plans the trainer can run: what `fm plan search` ranks goes back into `estimate` and out as
a job spec the spec loader accepts, predicting the same; the rest is shown apart, with why."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fm_pipeline.cli.plan import app
from fm_pipeline.config import load_job, parse_job
from fm_pipeline.defaults import DEMO_JOB
from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.job_plan import job_inputs
from fm_pipeline.planner.layout import Layout, parse_layout
from fm_pipeline.planner.plan_spec import spec_sections
from fm_pipeline.planner.runnable import not_runnable, runnable_mask
from fm_pipeline.planner.search import enumerate_candidates, search
from fm_pipeline.planner.shape import named_shape

H100 = make_cluster("h100")
CASES = [("llama3-8b", 8192, 8, 64 * 8192), ("llama3-70b", 8192, 512, 4 * 2**20),
         ("dense-1t", 8192, 16384, 16 * 2**20), ("llama3-1b", 4096, 64, 2**20),
         ("mixtral-8x7b", 4096, 64, 4 * 2**20), ("deepseek-v3-like", 4096, 2048, 16384 * 4096)]


def _spec(shape, layout, batch, precision="bf16") -> dict:
    data = yaml.safe_load(DEMO_JOB.read_text())["data"]
    return {"name": "plan", "data": data,
            **spec_sections(shape, H100, layout, global_batch_tokens=batch, precision=precision,
                            checkpoint_every_steps=50)}


@pytest.mark.parametrize("model,seq,gpus,batch", CASES, ids=[c[0] for c in CASES])
def test_every_plan_found_is_runnable_and_round_trips_through_estimate_and_a_job_spec(
        model, seq, gpus, batch):
    shape = named_shape(model, seq_len=seq)
    result = search(shape, H100, gpus=gpus, global_batch_tokens=batch, top=5)
    assert result.plans, "the runnable space has a fitting plan for each case"
    for plan in result.plans:
        assert not_runnable(shape, plan.layout) == []
        found = result.metrics(plan.index)
        again = estimate(shape, H100, parse_layout(plan.layout.describe()),
                         global_batch_tokens=batch).metrics
        assert again["mfu"] == pytest.approx(found["mfu"], rel=1e-9), plan.layout.describe()
        assert again["memory_gib_per_gpu"] == pytest.approx(found["memory_gib_per_gpu"])
        job = parse_job(_spec(shape, plan.layout, batch))
        inp = job_inputs(job)
        assert inp["layout"].describe() == plan.layout.describe()
        via_spec = estimate(inp["shape"], inp["cluster"], inp["layout"],
                            global_batch_tokens=inp["global_batch_tokens"],
                            precision=inp["precision"]).metrics
        assert via_spec["mfu"] == pytest.approx(found["mfu"], rel=1e-9)


@pytest.mark.parametrize("precision", ["fp8", "fp8-rowwise"])
def test_fp8_plans_round_trip_into_a_job_spec_the_trainer_runs_in_fp8(precision):
    shape, batch = named_shape("llama3-70b", seq_len=8192), 4 * 2**20
    result = search(shape, H100, gpus=512, global_batch_tokens=batch, top=3, precision=precision)
    bf16 = search(shape, H100, gpus=512, global_batch_tokens=batch, top=1)
    assert result.plans and result.precision == ("fp8-tensorwise" if precision == "fp8"
                                                 else precision)
    assert (result.metrics(result.plans[0].index)["tokens_per_s"]
            > bf16.metrics(bf16.plans[0].index)["tokens_per_s"])
    for plan in result.plans:
        found = result.metrics(plan.index)
        job = parse_job(_spec(shape, plan.layout, batch, precision=result.precision))
        assert job.parallelism.mixed_precision == result.precision
        inp = job_inputs(job)
        via_spec = estimate(inp["shape"], inp["cluster"], inp["layout"],
                            global_batch_tokens=inp["global_batch_tokens"],
                            precision=inp["precision"]).metrics
        assert via_spec["mfu"] == pytest.approx(found["mfu"], rel=1e-9)


def test_fp8_the_trainer_does_not_have_is_planned_apart_with_the_reason():
    shape, batch = named_shape("llama3-70b", seq_len=8192), 4 * 2**20
    blockwise = search(shape, H100, gpus=512, global_batch_tokens=batch, precision="fp8-blockwise")
    assert blockwise.plans == [] and blockwise.not_runnable
    assert all("tensorwise and rowwise" in " ".join(p.reasons) for p in blockwise.not_runnable)
    moe = named_shape("mixtral-8x7b", seq_len=4096)
    assert "experts stay bf16" in " ".join(
        not_runnable(moe, Layout(dp=64, ep=8, sharding="fsdp"), precision="fp8"))
    with pytest.raises(PlanInputError, match="blockwise"):
        spec_sections(shape, H100, Layout(tp=8, dp=64, sharding="fsdp"), global_batch_tokens=batch,
                      precision="fp8-blockwise", checkpoint_every_steps=10)


def test_faster_layouts_the_trainer_cannot_run_are_listed_apart_with_the_reason():
    # Context parallelism and DeepSpeed's ZeRO-2 are the cost model's only: faster plans
    # using them are listed apart, each with its reasons.
    shape = named_shape("llama3-405b", seq_len=8192)
    result = search(shape, H100, gpus=8192, global_batch_tokens=16 * 2**20, top=3)
    anywhere = search(shape, H100, gpus=8192, global_batch_tokens=16 * 2**20, top=1,
                      runnable_only=False)
    assert result.not_runnable and all(p.reasons for p in result.not_runnable)
    best_elsewhere = result.metrics(result.not_runnable[0].index)["tokens_per_s"]
    best_anywhere = anywhere.metrics(anywhere.plans[0].index)["tokens_per_s"]
    assert best_elsewhere == pytest.approx(best_anywhere)
    floor = result.metrics(result.plans[0].index)["tokens_per_s"] if result.plans else 0
    assert all(result.metrics(p.index)["tokens_per_s"] > floor for p in result.not_runnable)
    reasons = " ".join(r for p in result.not_runnable for r in p.reasons)
    assert "context parallelism" in reasons or "ZeRO-2" in reasons


def test_llama3s_published_layout_is_runnable_with_its_uneven_stages():
    """126 layers over Llama 3's 16 stages: the first and last one layer lighter (the
    paper's balancing), written as parallelism.pp_layers_per_stage, which the trainer runs
    (tests/train/test_uneven_stages.py trains a 1-2-2-1 split and resumes it elsewhere)."""
    from fm_pipeline.config import parse_job
    from fm_pipeline.planner.runnable import balanced_split

    shape = named_shape("llama3-405b", seq_len=8192)
    published = Layout(tp=8, pp=16, dp=128, micro_batch=1, recompute="full", sharding="zero1")
    assert not_runnable(shape, published) == []
    sections = spec_sections(shape, H100, published, global_batch_tokens=16 * 2**20,
                             precision="bf16", checkpoint_every_steps=100)
    split = sections["parallelism"]["pp_layers_per_stage"]
    assert split == [7] + [8] * 14 + [7] and split == balanced_split(126, 16)
    job = parse_job({"name": "llama3", **sections,
                     "data": {"sources": [{"name": "a", "uri": "x", "weight": 1.0}]}})
    assert job.parallelism.pp_layers_per_stage == split
    assert balanced_split(10, 4) == [2, 3, 3, 2] and balanced_split(8, 4) is None
    assert balanced_split(7, 4) == [2, 2, 2, 1]  # past the middle: the first, not the head's
    why = not_runnable(named_shape("llama3-8b", seq_len=8192), Layout(pp=64, dp=1,
                                                                     sharding="ddp"))
    assert why == ["32 layers cannot give each of pp x virtual_stages = 64 pipeline chunks one"]


@pytest.mark.parametrize("model,gpus", [("llama3-1b", 64), ("llama3-405b", 1024),
                                        ("mixtral-8x7b", 64)])
def test_the_vectorized_mask_agrees_with_the_reasons(model, gpus):
    shape = named_shape(model, seq_len=8192)
    c = enumerate_candidates(shape, gpus=gpus, global_batch_tokens=4 * 2**20)
    mask = runnable_mask(shape, c)
    assert mask.any() and not mask.all()
    for i in np.random.default_rng(0).choice(len(c), size=min(400, len(c)), replace=False):
        assert bool(mask[i]) == (not_runnable(shape, c.layout(int(i))) == []), c.layout(int(i))


def test_layouts_parse_back_from_what_search_prints():
    for lay in (Layout(tp=8, pp=16, dp=16, micro_batch=2, virtual_stages=4, recompute="full",
                       sharding="fsdp", dp_shard=8),
                Layout(tp=2, pp=4, dp=8, schedule="GPipe", sharding="ddp"),
                Layout(tp=1, dp=64, cp=2, sharding="zero1", dp_shard=8)):
        back = parse_layout(lay.describe())
        assert back.describe() == lay.describe()
        assert back.pipeline_schedule == lay.pipeline_schedule
        assert back.shard_group == lay.shard_group
    for bad, says in (("tp=x", "whole number"), ("zero9", "sharding"), ("fsdp/x", "sharding"),
                      ("foo=1", "unknown key")):
        with pytest.raises(PlanInputError, match=says) as e:
            parse_layout(bad)
        assert e.value.field == "layout"


def test_a_spec_is_refused_for_what_the_trainer_cannot_build():
    gpt = named_shape("gpt3-175b")
    with pytest.raises(PlanInputError, match="GPT-style") as e:
        spec_sections(gpt, H100, Layout(tp=8, pp=8, dp=16), global_batch_tokens=2**20,
                      precision="bf16", checkpoint_every_steps=10)
    assert e.value.field == "model"
    llama = named_shape("llama3-70b", seq_len=8192)
    with pytest.raises(PlanInputError, match="cp 2.*zero2") as e:
        spec_sections(llama, H100, Layout(tp=8, dp=32, cp=2, sharding="zero2"),
                      global_batch_tokens=2**20, precision="bf16", checkpoint_every_steps=10)
    assert e.value.field == "layout"


def test_the_cli_writes_the_plan_as_a_job_spec_that_estimates_the_same(tmp_path):
    runner = CliRunner()
    model = ["--model", "llama3-70b", "--seq-len", "8192", "--global-batch-tokens",
             str(4 * 2**20), "--gpus", "512", "--gpu-type", "h100"]
    spec = tmp_path / "plan.yaml"
    r = runner.invoke(app, ["search", *model, "--top", "3", "--json", "--write-spec", str(spec),
                            "--spec-rank", "2", "--name", "seventy"])
    assert r.exit_code == 0, r.output
    found = json.loads(r.stdout)
    second = found["plans"][1]
    assert found["spec_written"] == str(spec) and found["precision"] == "bf16"
    assert "not_runnable_here" in found
    job = load_job(spec)
    assert job.name == "seventy" and job.parallelism.mixed_precision == "bf16"
    assert job.checkpoint.every_steps >= 1 and job.training.steps > 1000
    # 64 nodes: the two-level plan. Most of such a job's failures are its own (software
    # bugs: one a day whatever the size), which the fast tier does not survive, so its
    # snapshots may come no more often than the durable saves.
    planned = json.loads(runner.invoke(app, ["estimate", *model, "--layout", second["describe"],
                                             "--json"]).stdout)["fast_tier"]
    assert job.checkpoint.memory_every_steps == planned["fast_interval_steps"] >= 1
    assert job.checkpoint.every_steps == planned["durable_interval_steps"]
    assert job.checkpoint.every_steps >= job.checkpoint.memory_every_steps
    assert job.resilience.inplace_restarts > 0
    by_job = runner.invoke(app, ["estimate", "--job", str(spec), "--json"])
    assert by_job.exit_code == 0, by_job.output
    by_layout = runner.invoke(app, ["estimate", *model, "--layout", second["describe"], "--json"])
    assert by_layout.exit_code == 0, by_layout.output
    # Interval, segment length and grace period come from the plan: nothing to critique.
    assert json.loads(by_job.stdout)["critique"] == []
    assert job.training.segment_steps > 20 and job.training.preemption_grace_s > 25
    for out in (json.loads(by_job.stdout), json.loads(by_layout.stdout)):
        assert out["mfu"] == pytest.approx(second["mfu"], rel=1e-9)
        assert out["precision"] == "bf16" and out["warnings"] == []
    bad = runner.invoke(app, ["search", *model, "--write-spec", str(spec), "--spec-rank", "9"])
    assert bad.exit_code == 2 and "--spec-rank" in bad.output


def test_a_layout_the_trainer_cannot_run_is_estimated_with_a_warning():
    est = estimate(named_shape("llama3-70b", seq_len=8192), H100,
                   Layout(tp=8, dp=32, cp=2, sharding="zero2"), global_batch_tokens=2**20)
    warned = [w for w in est.warnings if w.startswith("not runnable by the trainer")]
    assert len(warned) == 2 and est.to_dict()["precision"] == "bf16"


def test_zero1_is_written_as_fsdp_keeping_weights_and_gradients_gathered():
    """The planner's zero1 (one all-gather and one reduce-scatter a step, weights and
    gradients whole through it) is what FSDP2 does with parallelism.fsdp_keep_gathered
    (counted in tests/parallel/test_fsdp_keep_gathered.py): runnable, written so, and read
    back as zero1; DeepSpeed's ZeRO-2 (a reduce-scatter every micro-batch) is not."""
    from fm_pipeline.config import parse_job
    from fm_pipeline.planner.job_plan import job_inputs

    llama = named_shape("llama3-8b", seq_len=8192)
    zero1 = Layout(tp=1, dp=16, micro_batch=1, recompute="full", sharding="zero1", dp_shard=8)
    assert not_runnable(llama, zero1) == []
    sections = spec_sections(llama, H100, zero1, global_batch_tokens=64 * 8192,
                             precision="bf16", checkpoint_every_steps=10)
    p = sections["parallelism"]
    assert (p["fsdp_keep_gathered"], p["dp_shard"], p["dp_replicate"]) == (True, 8, 2)
    job = parse_job({"name": "z1", **sections,
                     "data": {"sources": [{"name": "a", "uri": "x", "weight": 1.0}]}})
    assert job_inputs(job)["layout"].describe() == zero1.describe()
    (why,) = not_runnable(llama, Layout(tp=1, dp=16, sharding="zero2"))
    assert "every micro-batch" in why and "fsdp_keep_gathered" in why
    assert not_runnable(llama, Layout(tp=8, dp=1, sharding="zero1")) == [
        "zero1 over one data-parallel rank: the trainer runs that unsharded (ddp)"]
