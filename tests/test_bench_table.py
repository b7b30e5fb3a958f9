"""The README's benchmark table is rendered from the JSON `make bench` saves (real outputs
of one run, in tests/bench_fixtures): every row names its baseline, and a missed target says
which figure missed it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.table import render

FIXTURES = Path(__file__).parent / "bench_fixtures"


def _rows(table: str) -> dict[str, str]:
    return {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| `benchmarks.")}


def _verdict(row: str) -> str:
    """The "this run" cell (the last but the day it was measured)."""
    return row.rstrip(" |").rsplit("|", 2)[1].strip()


def test_each_row_shows_the_median_its_spread_and_the_same_run_baseline():
    rows = _rows(render(FIXTURES))
    assert set(rows) == {f"`benchmarks.{b}`" for b in
                         ("data", "data_stages", "datatrove_dedup", "remote_data", "trainer",
                          "fsdp_keep", "checkpoint", "planner", "planner_fidelity",
                          "simulation", "recovery", "k8s")} | {"`benchmarks.recovery` (fast tier)"}
    ckpt = json.loads((FIXTURES / "checkpoint.json").read_text())
    row = rows["`benchmarks.checkpoint`"]
    assert f"save_ratio_streamed {ckpt['save_ratio_streamed']:.2f}" in row
    assert f"(spread {ckpt['save_ratio_streamed_spread']:.2f})" in row
    assert "the way the checkpoint writes them" in row  # the like-for-like baseline
    assert _verdict(row) == "**missed**: load_ratio"
    assert "tok/s" in rows["`benchmarks.trainer`"] and "FSDP2" in rows["`benchmarks.trainer`"]
    assert "encode_batch_fast" in rows["`benchmarks.data`"]
    keep = json.loads((FIXTURES / "fsdp_keep.json").read_text())
    row = rows["`benchmarks.fsdp_keep`"]
    # The flag against FSDP2's default in the same run, the same training (losses agree).
    assert f"keep_gathered_speedup {keep['keep_gathered_speedup']:.3f}" in row
    assert f"{keep['default_wall_tokens_per_s']:,.0f} tok/s vs fsdp_keep_gathered" in row
    assert keep["max_loss_diff"] < 1e-4 and _verdict(row) == "no target"
    stages = json.loads((FIXTURES / "data_stages.json").read_text())
    row = rows["`benchmarks.data_stages`"]
    assert f"workers_speedup {stages['workers_speedup']:.3f}" in row
    assert f"one process on one core {stages['prepare_s_1_worker_1_core']:.0f} s" in row
    assert f"ceiling on these cores {stages['workers_speedup_ceiling']:.3f}" in row
    assert f"its {stages['cpu_s_1_worker']:.0f} CPU s" in row
    assert _verdict(row) == "**missed**: workers_speedup"
    assert "datatrove not run" in row
    dt = json.loads((FIXTURES / "datatrove_dedup.json").read_text())
    row = rows["`benchmarks.datatrove_dedup`"]
    # Ours against datatrove in the same run, the words split the same way on both sides.
    assert f"vs_datatrove_throughput {dt['vs_datatrove_throughput']:.3f}" in row
    assert "in the same run" in row and "words split with \\w+ on both sides" in row
    assert _verdict(row) == "**missed**: vs_datatrove_throughput"
    rec = json.loads((FIXTURES / "recovery.json").read_text())
    row = rows["`benchmarks.recovery` (fast tier)"]
    # The restart with peers: 2 ranks and 2 nodes x 2 ranks, each beside its durable path.
    for suffix, what in (("_2_ranks", "2 ranks"), ("_2_nodes", "2 nodes x 2 ranks")):
        assert f"{what}" in row and f"in place {rec[f'inplace_resume_s{suffix}']:.2f} s" in row
        assert f"durable {rec[f'durable_resume_s{suffix}']:.1f} s" in row
    k8s = json.loads((FIXTURES / "k8s.json").read_text())
    row = rows["`benchmarks.k8s`"]
    # Both launchers' medians for the same job in the same run, the spread and the versions;
    # no target was set, and the row says so rather than "met".
    assert f"evict -> checkpoint {k8s['kubernetes']['evict_to_checkpoint_s']:.1f} (spread " \
           f"{k8s['spread']['kubernetes']['evict_to_checkpoint_s']:.1f}) s" in row
    assert f"the local launcher, same job and run: submit -> first step " \
           f"{k8s['local']['submit_to_first_step_s']:.1f}" in row
    assert k8s["real_controllers"] and "Kueue v0.19.2" in row
    assert _verdict(row) == "no target"


def test_a_benchmark_not_run_says_so_and_a_met_target_says_met(tmp_path):
    shutil.copy(FIXTURES / "planner.json", tmp_path)
    rows = _rows(render(tmp_path))
    assert _verdict(rows["`benchmarks.planner`"]) == "met"
    assert "| not run |" in rows["`benchmarks.data`"]
