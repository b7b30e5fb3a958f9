"""The planner through its own command line, on every published run, with only what each
source publishes (benchmarks.planner_fidelity): the figures the README shows are the ones
the command gives today, and they do not get worse."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import planner_fidelity as pf
from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import parse_layout
from fm_pipeline.planner.literature import PUBLISHED_RUNS
from fm_pipeline.planner.shape import named_shape

FIXTURE = Path(__file__).parents[1] / "bench_fixtures" / "planner_fidelity.json"


@pytest.fixture(scope="module")
def cli():
    return pf.Cli()


@pytest.fixture(scope="module")
def rows(cli):
    return [pf.predict(cli, run) for run in PUBLISHED_RUNS]


def by_key(key: str):
    return next(r for r in PUBLISHED_RUNS if r.key == key)


def test_a_row_is_what_its_source_publishes_and_nothing_else():
    run = by_key("nar21-t1-1t")  # Megatron 2021: no sequence parallelism, no overlaps
    argv = pf.common_argv(run)
    assert argv[argv.index("--gpu-type") + 1] == "a100-80gb"
    assert {"--no-sequence-parallel", "--no-tp-overlap", "--no-dp-overlap"} <= set(argv)
    assert pf.layout_text(run) == "tp=8 pp=64 dp=6 cp=1 ep=1 mb=1 v=1 recompute=full ddp"
    # A source silent on a setting leaves the command's default, not the search's choice.
    llama = pf.layout_text(by_key("llama3-405b-16384-8192"))
    assert "recompute=none" in llama and llama.endswith("fsdp") and "v=1" in llama
    # Shape settings a source publishes (DeepSeek-V3's latent heads) are flags too.
    dsv3 = pf.common_argv(by_key("dsv3-2048-h800"))
    assert dsv3[dsv3.index("--qk-head-dim") + 1] == "192"
    assert dsv3[dsv3.index("--route-nodes") + 1] == "4"


def test_the_command_line_predicts_what_the_api_does(cli):
    run = by_key("dsv3-2048-h800")
    out = cli("plan", "estimate", *pf.common_argv(run), "--layout", pf.layout_text(run))
    shape = dataclasses.replace(named_shape(run.model, seq_len=run.seq_len),
                                **run.shape_overrides)
    api = estimate(shape, make_cluster(run.gpu_type, inter_node_gbps=run.inter_node_gbps),
                   parse_layout(pf.layout_text(run)), precision=run.precision,
                   global_batch_tokens=run.global_batch * run.seq_len,
                   training_tokens=run.training_tokens, ep_overlap=run.ep_overlap)
    assert out["step_time_s"] == pytest.approx(api.metrics["step_time_s"])
    assert out["mfu"] == pytest.approx(api.metrics["mfu"])


def test_errors_are_mfu_points_of_the_same_flops(rows):
    llama = next(r for r in rows if r.run.key == "llama3-405b-8192-8192")
    assert llama.err_pts == pytest.approx(100 * (llama.mfu - 0.43))
    # A published time: the MFU the source implies is the planner's own FLOPs over it.
    dgx = next(r for r in rows if r.run.key == "dgxc24-70b-64-bf16")
    implied = dgx.mfu * dgx.predicted / dgx.run.value
    assert dgx.err_pts == pytest.approx(100 * (dgx.mfu - implied))
    memory = [r for r in rows if r.run.metric == "memory_gib"]
    assert memory and all(r.err_pts is None for r in memory)


def test_the_readme_figures_are_todays_and_within_their_bounds(rows):
    """The committed fixture's headline is what the command gives now (nothing here is
    random), and each figure stays within the bound it reached: a model change that makes
    the planner worse on published runs fails here."""
    committed = json.loads(FIXTURE.read_text())
    speed = pf.speed_rows(rows)
    median = pf.median_abs(r.err_pts for r in speed)
    worst = max(abs(r.err_pts) for r in speed)
    assert median == pytest.approx(committed["median_abs_err_pts"])
    assert worst == pytest.approx(committed["max_abs_err_pts"])
    assert len(speed) == committed["headline_rows"]
    assert median <= committed["targets"]["median_abs_err_pts"]  # the 3 points
    assert worst <= 16.0  # target 6: not met (Llama 3's unpublished settings, torchtitan)
    titan = [r for r in rows if r.run.metric == "tokens_per_s_gpu" and not r.run.not_expressible]
    assert pf.median_abs(r.rel_err for r in titan) == pytest.approx(
        committed["torchtitan_tok_s_err"])
    assert committed["loso_median_abs_err_pts"] <= 4.1


def test_the_fit_picks_a_grid_point_and_leaves_what_the_rows_cannot_tell(cli, monkeypatch):
    monkeypatch.setattr(pf, "GRID", {"K_HALF": (256, 1024), "ELEMENTWISE_PASSES": (2.0,),
                                     "EP_OVERLAP_1F1B": (0.0, 0.3)})
    dense = [by_key("kor22-22b-full"), by_key("kor22-175b-full")]
    point, err = pf.fit(cli, dense)
    # Dense rows say nothing of the MoE overlap: it stays where it was shipped.
    assert point["EP_OVERLAP_1F1B"] == 0.3 and point["K_HALF"] in (256, 1024)
    with pf.constants(point):
        assert err == pytest.approx(sum(abs(pf.predict(cli, r).err_pts) for r in dense) / 2)
    assert pf.shipped()["K_HALF"] == 256  # the context restored the module's constants


def test_the_calibration_document_shows_the_committed_figures():
    doc = Path(__file__).parents[2] / "docs" / "calibration-planner.md"
    committed = json.loads(FIXTURE.read_text())
    text = doc.read_text()
    assert pf.with_doc(text, pf.markdown(committed)) == text, (
        "docs/calibration-planner.md is not the committed fixture's: run " + pf.DOC_START)
