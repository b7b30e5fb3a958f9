"""The README's benchmark table, rendered from the JSON objects `make bench` saved.

    python -m benchmarks.table .fm/bench                      # prints the markdown table
    python -m benchmarks.table tests/bench_fixtures --readme README.md   # rewrites its table

One row per benchmark (two for recovery: the durable path and the fast tier): its headline
figure (the median over the benchmark's repeats, with the spread, max - min, and how many),
the baseline it is divided by (measured in the same run), the other figures worth reading,
the target, whether this run met it, and the day it ran (`measured_on`, stamped by `make
bench`). A benchmark with no saved JSON, or a JSON without a row's figures, gets a row that
says it was not run. The README's table sits between README_START and README_END and is
exactly `render(tests/bench_fixtures)`: tests/test_readme_tables.py fails on any drift.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

Row = tuple[str, str, str, str, str]  # headline, baseline, also, target, met


def _f(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _met(flags: dict | bool) -> str:
    if isinstance(flags, bool):
        return "met" if flags else "**missed**"
    missed = [k for k, ok in flags.items() if not ok]
    return "met" if not missed else "**missed**: " + ", ".join(missed)


def _data(r: dict) -> Row:
    return (f"tokenize_ratio_vs_fast {_f(r['tokenize_ratio_vs_fast'], 3)} "
            f"(spread {_f(r['tokenize_ratio_vs_fast_spread'], 3)}, {r['repeats']} rounds)",
            f"`tokenizers` encode_batch_fast on the same texts: "
            f"{r['raw_tokenizers_fast_tokens_per_s'] / 1e6:.2f} M tok/s vs ours "
            f"{r['tokenize_tokens_per_s'] / 1e6:.2f} M",
            f"vs encode_batch_fast + the same flattening {_f(r['tokenize_ratio_vs_fast_ids'], 3)}; "
            f"vs encode_batch (offsets) {_f(r['tokenize_ratio'], 3)}; loader "
            f"{r['loader_tokens_per_s'] / 1e6:.0f} M tok/s = "
            f"{_f(r['loader_ratio_vs_direct_gather'])} of a direct gather",
            ">= 0.9", _met(r["targets_met"]))


def _remote_data(r: dict) -> Row:
    return (f"stall_ratio {_f(r['stall_ratio'], 3)} (spread {_f(r['stall_ratio_spread'], 3)}, "
            f"{r['repeats']} rounds): data stall {r['stall_s_per_step_plain'] * 1e3:.0f} -> "
            f"{r['stall_s_per_step_ahead'] * 1e3:.0f} ms per step",
            "the same loader without speculative shard fetches, same samples, same slow link "
            + (f"({r['latency_ms']:.0f} ms per read, one {r['mb_per_s']:.0f} MB/s link shared "
               f"by the reads in flight, {r['shard_mib']:g} MiB shards), " if r.get("link")
               == "shared" else f"({r['latency_ms']:.0f} ms + {r['mb_per_s']:.0f} MB/s per "
               "read), ")
            + f"{r['compute_s_per_step'] * 1e3:.0f} ms of compute per step",
            f"wall {r['wall_s_plain']:.2f} s -> {r['wall_s_ahead']:.2f} s for {r['steps']} "
            f"steps (remote_speedup {_f(r['remote_speedup'])}, spread "
            f"{_f(r['remote_speedup_spread'])}); shards a step downloaded itself "
            f"{r['on_demand_plain']:.0f} -> {r['on_demand_ahead']:.0f} of {r['shards']}",
            f"<= {r['target_stall_ratio']}", _met(r["targets_met"]))


def _datatrove_dedup(r: dict) -> Row:
    return (f"vs_datatrove_throughput {_f(r['vs_datatrove_throughput'], 3)} (spread "
            f"{_f(r['vs_datatrove_throughput_spread'], 3)}, {r['repeats']} rounds): datatrove's "
            f"four MinHash stages {r['datatrove_s']:.1f} s / our clean_documents "
            f"{r['ours_s']:.1f} s (it also normalises, filters, exact-dedups and writes)",
            f"datatrove {r['datatrove']} on the same {r['corpus_mb']:.0f} MB corpus in the same "
            f"run, 2 processes each, 14 x 8 bands, words split with \\w+ on both sides",
            f"datatrove_agreement {_f(r['datatrove_agreement'], 4)} (removed: ours "
            f"{r['ours_removed']:,}, datatrove {r['datatrove_removed']:,})",
            f">= {r['target_vs_datatrove_throughput']:g}; >= 0.99", _met(r["targets_met"]))


def _trainer(r: dict) -> Row:
    return (f"overhead_ratio_wall {_f(r['overhead_ratio_wall'], 3)} (spread "
            f"{_f(r['overhead_ratio_wall_spread'], 3)}); fsdp2_overhead_ratio "
            f"{_f(r['fsdp2_overhead_ratio'], 3)} "
            f"(spread {_f(r['fsdp2_overhead_ratio_spread'], 3)}); "
            f"{r['repeats']} runs each",
            f"a bare torch loop of the same model and batch over the same timed window: 1 rank "
            f"{_f(r['bare_loop_wall_tokens_per_s'], 0)} tok/s vs the trainer "
            f"{_f(r['trainer_wall_tokens_per_s'], 0)}; 2 ranks (torchrun, gloo) a bare FSDP2 loop with the same units and resharding "
            f"{_f(r['fsdp2_bare_wall_tokens_per_s'], 0)} vs "
            f"{_f(r['fsdp2_trainer_wall_tokens_per_s'], 0)}",
            f"median-interval ratio {_f(r['overhead_ratio'], 3)}; CPU ratio "
            f"{_f(r['cpu_overhead_ratio'], 3)}; CPU MFU {_f(r['trainer_mean_mfu'])}",
            ">= 0.98 both", _met(r["targets_met"]))


def _checkpoint(r: dict) -> Row:
    mb = r["bytes"] / 1e6
    return (f"save_ratio_streamed {_f(r['save_ratio_streamed'])} (spread "
            f"{_f(r['save_ratio_streamed_spread'])}); load_ratio {_f(r['load_ratio'])} (spread "
            f"{_f(r['load_ratio_spread'])}); async_total_ratio {_f(r['async_total_ratio'])} "
            f"(spread {_f(r['async_total_ratio_spread'])}); {r['repeats']} runs, {mb:.0f} MB",
            "save: the same bytes written the way the checkpoint writes them (direct I/O "
            "where the filesystem has it) + fsync; load: a cold raw read of the same bytes; "
            "async: the sync save",
            f"load vs a raw read into a full-size buffer {_f(r['load_ratio_in_place'])}; "
            f"stall_ratio {_f(r['stall_ratio'], 3)} (block only); async = block "
            f"{r['async_block_s'] * 1e3:.0f} ms + following steps "
            f"{r['following_steps_extra_s']:.2f} s vs sync {r['sync_save_s']:.2f} s; direct I/O "
            f"{'on' if r['direct_io'] else 'off'}",
            ">= 0.8, >= 0.8, < 1.0", _met(r["targets_met"]))


def _planner(r: dict) -> Row:
    precision = r.get("precision", "bf16")
    also = f"best predicted MFU {r['best_mfu']:.1%}"
    if "bf16_search_s" in r:
        also = f"BF16 search {r['bf16_search_s']:.3f} s in the same rounds; " + also
    return (f"{precision} search {r['search_s']:.3f} s (spread {r['search_spread_s']:.3f} s, "
            f"{r['repeats']} runs): {r['candidates_evaluated']:,} layouts, 1T dense on "
            f"{r['gpus']:,} {r['gpu_type']}",
            "none: no per-candidate evaluator to compare with (no speed-up claimed)",
            also, f"<= {r['target_s']:g} s", _met(r["meets_target"]))


def _planner_fidelity(r: dict) -> Row:
    t = r["targets"]
    checks = {"median": r["median_abs_err_pts"] <= t["median_abs_err_pts"],
              "max": r["max_abs_err_pts"] <= t["max_abs_err_pts"],
              "loso": r["loso_median_abs_err_pts"] <= t["loso_median_abs_err_pts"],
              "torchtitan tok/s": r["torchtitan_tok_s_err"] <= t["torchtitan_tok_s_err"],
              "torchtitan memory": r["torchtitan_memory_err"] <= t["torchtitan_memory_err"],
              "fits_all": r["fits_all"]}
    return (f"median absolute error {r['median_abs_err_pts']:.1f} MFU points, max "
            f"{r['max_abs_err_pts']:.1f}, leave-one-source-out {r['loso_median_abs_err_pts']:.1f} "
            f"({r['headline_rows']} published runs through `fm plan estimate`, published "
            "settings only; deterministic: 1 run)",
            "none: the published figures are the reference",
            f"torchtitan tok/s {r['torchtitan_tok_s_err']:.0%}, memory "
            f"{r['torchtitan_memory_err']:.0%}; {len(r['not_fitting'])} published runs over "
            f"the planner's memory; constants fitted on the tuning rows "
            f"{'are' if r['shipped_constants_are_the_fit'] else 'are not'} the shipped ones",
            f"<= {t['median_abs_err_pts']:g}, <= {t['max_abs_err_pts']:g}, <= "
            f"{t['loso_median_abs_err_pts']:g} points; torchtitan <= "
            f"{t['torchtitan_tok_s_err']:.0%}; all fit", _met(checks))


def _simulation(r: dict) -> Row:
    return (f"{r['days']} days x {r['gpus']:,} GPUs in {r['sim_s']:.3f} s (spread "
            f"{r['sim_spread_s']:.3f} s, {r['repeats']} seeds)",
            f"a per-component event model of the same cluster: {r['per_component_sim_s']:.2f} s "
            f"(x{r['speedup']:.0f})",
            f"ETTR {r['ettr']:.3f}; {r['interruptions']:.0f} interruptions "
            f"(per-component {r['per_component_interruptions']:.0f})",
            f"< {r['target_sim_s']:.0f} s", _met(r["meets_target"]))


def _recovery(r: dict) -> Row:
    return (f"durable_resume_s {r['durable_resume_s']:.1f} (spread "
            f"{r['spread']['durable_resume_s']:.1f}, {r['repeats']} jobs): fault -> the resumed "
            "segment's first step, through the daemon",
            f"a cold start of the same job in the same run: {r['cold_start_s']:.1f} s",
            f"detection {r['detection_s']:.1f} s, sensor {r['failure_sensor_s']:.1f} s, launch "
            f"{r['launch_s']:.1f} s, restore {r['restore_s']:.2f} s (docs/orchestration.md)",
            f"<= {r['target_durable_resume_s']:.0f} s",
            _met(r["durable_resume_s"] <= r["target_durable_resume_s"]))


def _data_stages(r: dict) -> Row:
    rss = r["worker_peak_rss_mb"]
    versus = (f"; datatrove_agreement {_f(r['datatrove_agreement'], 3)}, "
              f"vs_datatrove_throughput {_f(r['vs_datatrove_throughput'])}"
              if "datatrove_agreement" in r else "; datatrove not run")
    return (f"workers_speedup {_f(r['workers_speedup'], 3)} (spread "
            f"{_f(r['workers_speedup_spread'], 3)}, {r['repeats']} rounds): 2 worker processes "
            f"/ 1, every core to both; workers_speedup_core_each "
            f"{_f(r['workers_speedup_core_each'], 3)} (spread "
            f"{_f(r['workers_speedup_core_each_spread'], 3)}): a core per worker; ceiling on "
            f"these cores {_f(r['workers_speedup_ceiling'], 3)} (cores x the 1-worker wall / "
            f"its {r['cpu_s_1_worker']:.0f} CPU s)",
            f"the whole prepare (data_mix_job) in one process: {r['prepare_s_1_worker']:.0f} s "
            f"vs 2 processes {r['prepare_s_2_workers']:.0f} s; one process on one core "
            f"{r['prepare_s_1_worker_1_core']:.0f} s",
            f"{r['corpus_mb']:,.0f} MB, {r['documents']:,} documents, {r['tasks']} tasks on "
            f"{r['cores']} cores; peak RSS per step {max(rss['quarter'].values()):.0f} -> "
            f"{max(rss['full'].values()):.0f} MiB as the corpus grows 4x; dedup recall "
            f"{r['dedup_recall']:.4f}, false removal {r['dedup_false_removal']:g}{versus}",
            ">= 1.7; flat; >= 0.95, 0", _met(r["targets_met"]))


def _fast_tier(r: dict) -> Row | None:
    if "inplace_resume_s" not in r:
        return None
    spread = r["spread"]
    peer = (f"; peer_resume_s {r['peer_resume_s']:.1f} (spread {spread['peer_resume_s']:.1f}): "
            "a node lost, a spare's ranks from the peer's replicas"
            if "peer_resume_s" in r else "; peer_resume_s not run")
    def peers(suffix: str, what: str) -> str:
        if f"inplace_resume_s{suffix}" not in r:
            return f"; {what}: not run"
        return (f"; {what}: in place {r[f'inplace_resume_s{suffix}']:.2f} s (spread "
                f"{spread[f'inplace_resume_s{suffix}']:.2f}), durable "
                f"{r[f'durable_resume_s{suffix}']:.1f} s (spread "
                f"{spread[f'durable_resume_s{suffix}']:.1f}), durable_over_inplace "
                f"{r[f'durable_over_inplace{suffix}']:.1f}")

    return (f"inplace_resume_s {r['inplace_resume_s']:.2f} (spread "
            f"{spread['inplace_resume_s']:.2f}, {r['repeats']} runs): rank 0 raises -> the "
            "first step of the segment run again in the same process, from memory (1 rank); "
            f"inplace_process_resume_s {r['inplace_process_resume_s']:.2f} (spread "
            f"{spread['inplace_process_resume_s']:.2f}): the same fault through torchrun's "
            f"new worker{peer}",
            f"the durable path in the same run: {r['durable_resume_s']:.1f} s "
            f"(durable_over_inplace {r['durable_over_inplace']:.1f}, spread "
            f"{spread['durable_over_inplace']:.1f})" + peers("_2_ranks", "2 ranks")
            + peers("_2_nodes", "2 nodes x 2 ranks in namespaces (durable: both pods created "
                    "again at once, no daemon)"),
            f"restore from memory {r['inplace_restore_s']:.2f} s"
            + (f", from the peer {r['peer_restore_s']:.2f} s" if "peer_restore_s" in r else "")
            + f"; {r['inplace_steps_redone']:.0f} step(s) redone; snapshots block "
              f"{r['snapshot_block_ratio']:.1%} of the loop",
            f"<= {r['target_inplace_resume_s']:g} s; <= durable / "
            f"{r['target_durable_over_inplace']:g}",
            _met({"inplace_resume_s": r["inplace_resume_s"] <= r["target_inplace_resume_s"],
                  "durable_over_inplace":
                      r["durable_over_inplace"] >= r["target_durable_over_inplace"]}))


def _k8s(r: dict) -> Row:
    k, local, spread = r["kubernetes"], r["local"], r["spread"]

    def four(m: dict, s: dict | None = None) -> str:
        def one(key: str) -> str:
            return f"{m[key]:.1f}" + (f" (spread {s[key]:.1f})" if s else "")

        return (f"submit -> first step {one('submit_to_first_step_s')} s, kill -> resumed "
                f"step {one('kill_to_resumed_step_s')} s, evict -> checkpoint "
                f"{one('evict_to_checkpoint_s')} s, readmit -> resumed step "
                f"{one('readmit_to_resumed_step_s')} s")

    versions = r["versions"]
    return (f"{four(k, spread['kubernetes'])} ({r['repeats']} runs each), on the real "
            "controllers",
            f"the local launcher, same job and run: {four(local, spread['local'])}",
            f"{r['world']}; Kubernetes {versions['k8s.io/kubernetes']}, JobSet "
            f"{versions['sigs.k8s.io/jobset']}, Kueue {versions['sigs.k8s.io/kueue']}; pods are "
            "local processes (the process kubelet): no image pull, no network between nodes",
            "none set", "no target")


def _fsdp_keep(r: dict) -> Row:
    return (f"keep_gathered_speedup {_f(r['keep_gathered_speedup'], 3)} (spread "
            f"{_f(r['keep_gathered_speedup_spread'], 3)}, {r['repeats']} runs each)",
            f"FSDP2's default (weights resharded and gradients reduce-scattered every "
            f"micro-batch), same model, weights, batches and run: "
            f"{_f(r['default_wall_tokens_per_s'], 0)} tok/s vs fsdp_keep_gathered "
            f"{_f(r['keep_wall_tokens_per_s'], 0)}",
            f"the trainer on {r['ranks']} gloo ranks x {r['micro_batches_per_rank']} "
            f"micro-batches a step on {r['cores']} cores; losses agree to "
            f"{r['max_loss_diff']:.1e}; the memory it costs (whole weights and gradients) "
            "is not measured (no accelerator)",
            "none set", "no target")


# benchmark -> its rows: (label, renderer); a renderer returning None: not in this run.
ROWS: dict[str, list[tuple[str, Callable[[dict], Row | None]]]] = {
    "data": [("", _data)], "data_stages": [("", _data_stages)],
    "datatrove_dedup": [("", _datatrove_dedup)],
    "remote_data": [("", _remote_data)], "trainer": [("", _trainer)],
    "fsdp_keep": [("", _fsdp_keep)],
    "checkpoint": [("", _checkpoint)], "planner": [("", _planner)],
    "planner_fidelity": [("", _planner_fidelity)],
    "simulation": [("", _simulation)],
    "recovery": [("", _recovery), (" (fast tier)", _fast_tier)], "k8s": [("", _k8s)]}
README_START = "<!-- benchmark table: python -m benchmarks.table tests/bench_fixtures --readme README.md -->"
README_END = "<!-- end of benchmark table -->"


def render(directory: Path) -> str:
    lines = ["| benchmark | headline (median) | same-run baseline | also | target | this run "
             "| measured |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, rows in ROWS.items():
        path = Path(directory) / f"{name}.json"
        result = json.loads(path.read_text()) if path.exists() else None
        for label, row in rows:
            cells = row(result) if result is not None else None
            head = f"| `benchmarks.{name}`{label} | "
            if cells is None:
                lines.append(head + "not run | | | | | |")
            else:
                lines.append(head + " | ".join([*cells, result.get("measured_on", "?")]) + " |")
    return "\n".join(lines) + "\n"


def readme_table(text: str) -> str:
    """The table between the README's markers (ValueError when they are missing)."""
    try:
        start = text.index(README_START) + len(README_START)
        end = text.index(README_END, start)
    except ValueError:
        raise ValueError(f"no benchmark table between {README_START!r} and {README_END!r}") \
            from None
    return text[start:end].strip("\n") + "\n"


def with_table(text: str, table: str) -> str:
    start = text.index(README_START) + len(README_START)
    end = text.index(README_END, start)
    return text[:start] + "\n" + table + text[end:]


def main() -> None:
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--readme"):
        sys.exit("usage: python -m benchmarks.table <directory of <benchmark>.json files> "
                 "[--readme README.md]")
    table = render(Path(args[0]))
    if len(args) == 1:
        sys.stdout.write(table)
        return
    readme = Path(args[2])
    readme.write_text(with_table(readme.read_text(), table))
    print(f"{readme}: benchmark table rendered from {args[0]}")


if __name__ == "__main__":
    main()
