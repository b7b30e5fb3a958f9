"""Calibration against published runs stays where docs/calibration-planner.md says it is."""

from __future__ import annotations

import pytest

from fm_pipeline.planner.calibration import calibrate, summary


@pytest.fixture(scope="module")
def rows():
    return calibrate()


# The published layouts the planner's memory model puts over their GPU, by 1%: Megatron's
# Qwen3-235B pair (80.8 GiB) and Mixtral 8x22B (80.5 GiB), all three run with expandable
# segments, against the planner's 10% allocator margin. Predicted on the published layout.
OVER_MEMORY = {"moezoo25-qwen3-235b-256-h100", "moezoo25-qwen3-235b-256-h100-overlap",
               "moezoo25-mixtral-8x22b-128-h100"}


def test_every_published_configuration_fits_and_is_predicted(rows):
    import dataclasses

    from fm_pipeline.planner.cluster import make_cluster
    from fm_pipeline.planner.estimate import estimate
    from fm_pipeline.planner.layout import parse_layout
    from fm_pipeline.planner.shape import named_shape

    assert all(r.predicted is not None for r in rows), [
        r.run.key for r in rows if r.predicted is None]
    assert {r.run.key for r in rows if not r.fits} == OVER_MEMORY
    for row in (r for r in rows if r.run.key in OVER_MEMORY):
        run = row.run
        layout = parse_layout(row.layout)
        assert (layout.tp, layout.pp, layout.dp, layout.ep) == (run.tp, run.pp, run.dp,
                                                                run.pinned["ep"])
        assert layout.recompute == run.pinned["recompute"]
        shape = dataclasses.replace(named_shape(run.model, seq_len=run.seq_len),
                                    **run.shape_overrides)
        est = estimate(shape, make_cluster(run.gpu_type, inter_node_gbps=run.inter_node_gbps),
                       layout, global_batch_tokens=run.global_batch * run.seq_len,
                       ep_overlap=run.ep_overlap)
        assert 80 < est.metrics["memory_gib_per_gpu"] < 80 * 1.02
        assert row.predicted == pytest.approx(est.metrics["step_time_s"])


def test_errors_stay_within_the_documented_bounds(rows):
    s = summary(rows)
    assert s["median_abs_error"] < 0.10
    assert s["validation"]["median_abs_error"] < 0.10  # rows no constant was chosen on
    by_source = {}
    for r in rows:
        by_source.setdefault(r.run.key.split("-")[0], []).append(abs(r.error))
    assert max(by_source["kor22"]) < 0.12  # controlled benchmarks, every knob published
    assert max(by_source["llama3"]) < 0.10
    # Megatron 2021: no sequence parallelism, tensor-parallel traffic not overlapped (their
    # rows say so); modelled as the runs were, the A100 rows came down from +14-18% median.
    assert max(by_source["nar21"]) < 0.20
    assert max(by_source["dgxc24"]) < 0.20  # H100, BF16 and FP8, up to 2,304 GPUs
    # A production run (data, checkpoints, evaluation, failures) is slower than any
    # benchmark; upper bounds only, so that a better model can only tighten them.
    assert max(by_source["mtnlg22"]) < 0.45
    assert max(by_source["totals"]) < 0.65  # whole runs' GPU-hours (Llama 3, BLOOM)
    assert summary(rows)["production"]["predicted"] == 6


def test_fp8_is_calibrated_on_published_fp8_runs(rows):
    fp8 = [r for r in rows if r.run.precision.startswith("fp8") and r.run.metric != "memory_gib"]
    assert len(fp8) >= 10
    tensorwise = [r for r in fp8 if r.run.precision == "fp8-tensorwise"
                  and not r.run.key.startswith("mbridge")]  # MoE: see the MoE test
    assert max(abs(r.error) for r in tensorwise) < 0.20
    # torchtitan's FP8 / BF16 throughput ratios on the same layouts.
    ratios = [r for r in tensorwise if r.run.metric == "fp8_speedup"]
    assert len(ratios) == 4 and max(abs(r.error) for r in ratios) < 0.08
    # Rowwise is over-predicted on H100 (torchtitan's own note: its rowwise TP baseline is
    # slow, pytorch/torchtitan#1207); bounded, documented, never required to stay wrong.
    assert all(abs(r.error) < 0.35 for r in fp8 if r.run.precision == "fp8-rowwise")


def test_fp8_speedup_matches_every_published_bf16_fp8_pair(rows):
    predicted = {r.run.key: r.predicted for r in rows if r.run.key.startswith("dgxc24-")}
    published = {r.run.key: r.run.value for r in rows if r.run.key.startswith("dgxc24-")}
    pairs = [(k, k.replace("-bf16", "-fp8-tensorwise")) for k in predicted if k.endswith("-bf16")]
    assert len(pairs) == 6
    for bf16, fp8 in pairs:
        ours, theirs = predicted[bf16] / predicted[fp8], published[bf16] / published[fp8]
        assert ours > 1.2 and abs(ours / theirs - 1) < 0.25, (bf16, ours, theirs)


def test_strong_scaling_trend_matches_the_paper(rows):
    # NAR21 Table 2: same model and batch on 2x and 4x the GPUs loses per-GPU throughput.
    for model in ("175b", "529.6b"):
        series = sorted(
            (r for r in rows if r.run.key.startswith(f"nar21-t2-{model}-")),
            key=lambda r: r.run.gpus,
        )
        published = [r.run.value for r in series]
        predicted = [r.predicted for r in series]
        assert published == sorted(published, reverse=True)
        assert predicted == sorted(predicted, reverse=True)


def test_deepseek_v3_gpu_hours_with_its_published_system(rows):
    """FP8 blockwise GEMMs, FP8 dispatch, tokens sent to at most 4 nodes once each, the
    all-to-all overlapped (DualPipe), MLA's head widths: within 10% of the 2.664M
    H800-hours published."""
    (dsv3,) = [r for r in rows if r.run.key.startswith("dsv3-")]
    assert dsv3.run.metric == "gpu_hours" and abs(dsv3.error) < 0.10
    assert "ep=64" in dsv3.layout and "pp=16" in dsv3.layout


def test_megatrons_deepseek_v3_validates_the_fitted_all_to_all_overlap(rows):
    """Megatron-Core's DeepSeek-V3 on 1,024 H100 overlaps the all-to-all across micro-batches
    (its recipe says so): with the share of it that overlap hides fitted on Qwen3-235B's pair
    (a different model, GPU count and precision), the row is within 15%; hiding all of it,
    as DualPipe does, would be 69% optimistic."""
    import dataclasses

    from fm_pipeline.planner.calibration import predict_run

    (row,) = [r for r in rows if r.run.key.startswith("mbridge25-dsv3")]
    assert row.run.ep_overlap == "1f1b" and not row.run.tuning
    assert abs(row.error) < 0.15
    assert "ep=64" in row.layout and "tp=2" in row.layout  # ep folded over tp 2 x dp 32
    dualpipe = predict_run(dataclasses.replace(row.run, ep_overlap="dualpipe"))
    exposed = predict_run(dataclasses.replace(row.run, ep_overlap="none"))
    assert dualpipe.error > 0.4
    assert dualpipe.predicted < row.predicted < exposed.predicted


def test_the_1f1b_overlap_is_fitted_on_megatrons_qwen3_pair(rows):
    """step.EP_OVERLAP_1F1B makes the planner's ratio of Qwen3-235B's step without and with
    the overlap (same layout) the published 19.7 / 17.6; each row within 10%."""
    from fm_pipeline.planner.literature import MOEZOO25_OVERLAP_PAIR

    by_key = {r.run.key: r for r in rows}
    plain, overlap = (by_key[k] for k in MOEZOO25_OVERLAP_PAIR)
    assert plain.run.tuning and overlap.run.tuning
    published = plain.run.value / overlap.run.value
    assert plain.predicted / overlap.predicted == pytest.approx(published, rel=0.02)
    assert abs(plain.error) < 0.10 and abs(overlap.error) < 0.10


def test_the_qwen3_layouts_the_planner_misses_are_reported_with_their_errors(rows):
    """Two of Megatron's Qwen3-235B layouts are far off (docs/calibration-planner.md): tp 4
    x ep 8 runs 29.0 s where the planner predicts 17 s (+69%), and FSDP over 128 ranks with
    ep 8 runs 17.6 s where the planner charges its expert gathers per micro-batch (-37%)."""
    by_key = {r.run.key: r for r in rows}
    tp4 = by_key["moezoo25-qwen3-235b-256-h100-tp4"]
    fsdp = by_key["moezoo25-qwen3-235b-256-h100-fsdp"]
    assert 0.5 < tp4.error < 0.8 and tp4.layout.startswith("tp=4 pp=8 dp=8 ep=8")
    assert -0.45 < fsdp.error < -0.25 and "ep=8" in fsdp.layout and fsdp.layout.endswith("fsdp")


def test_memory_is_checked_against_the_peaks_torchtitan_published(rows):
    """Peak GiB per GPU of ten torchtitan layouts (FSDP, FSDP x TP, x PP, x CP up to 262K
    tokens): every one fits the 96 GB it ran on, and the model is off by a bounded amount
    (it omits allocator slack that grows with pipeline micro-batches, documented)."""
    memory = [r for r in rows if r.run.metric == "memory_gib"]
    assert len(memory) == 10
    assert all(r.predicted <= 96 for r in memory), [(r.run.key, r.predicted) for r in memory]
    assert summary(rows)["memory"]["median_abs_error"] < 0.15
    assert max(abs(r.error) for r in memory) < 0.35
    # The loss of a 32K-token sequence without tp (14 bytes a logit of a 128K vocabulary)
    # is most of Llama 3 8B's memory: counting one fp32 copy predicted 54 GiB, not 84.
    eight = [r for r in memory if "-8b-" in r.run.key]
    assert all(abs(r.error) < 0.15 for r in eight)


def test_the_2021_megatron_runs_are_modelled_as_they_ran(rows):
    """No sequence parallelism and no overlap of tensor-parallel traffic (NAR21, MT-NLG,
    KOR22's full-recomputation rows): modelled with both, the same rows were predicted
    faster by the gap the calibration used to call the A100 bias."""
    import dataclasses

    from fm_pipeline.planner.calibration import predict_run

    nar21 = [r for r in rows if r.run.key.startswith("nar21-t2-")]
    assert all(not r.run.sequence_parallel and not r.run.tp_overlap for r in nar21)
    modern = [predict_run(dataclasses.replace(r.run, sequence_parallel=True, tp_overlap=True))
              for r in nar21]
    for as_ran, as_if_modern in zip(nar21, modern, strict=True):
        assert as_if_modern.error > as_ran.error + 0.03, as_ran.run.key


def test_megatrons_tflops_convert_to_the_step_time_it_published():
    """literature.megatron_step_s is Megatron-LM's FLOP count: Qwen3-235B's published pair
    (19.7 s and 245 TFLOP/s per GPU, causal count) agrees within 1%, and Mixtral 8x22B's
    455 TFLOP/s (the whole attention matrix counted, as then) is 4.51 s a step."""
    from fm_pipeline.planner.literature import PUBLISHED_RUNS, megatron_step_s

    qwen3 = megatron_step_s(245, gpus=256, sequences=2048, seq_len=4096, layers=94, hidden=4096,
                            heads=64, kv_heads=4, ffn=1536, top_k=8, vocab=151936,
                            head_dim=128, causal=True)
    assert qwen3 == pytest.approx(19.7, rel=0.01)
    (mixtral,) = [r for r in PUBLISHED_RUNS if r.model == "mixtral-8x22b"]
    assert mixtral.value == pytest.approx(4.51, abs=0.01)
