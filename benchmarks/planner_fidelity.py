"""The planner against every published run in its table, through its own command line.

    python -m benchmarks.planner_fidelity

Each published row (fm_pipeline/planner/literature.py) is written as a user would write it:
`fm plan estimate --model ... --layout "tp=.. pp=.. dp=.. ..." --json` with the settings the
source publishes (GPU, layout, sharding, recomputation, micro-batch, interleaving, sequence
parallelism, overlaps, fabric) and nothing else: whatever a source leaves out stays at the
command's default (recompute none, FSDP, one micro-batch, no interleaving), never the
search's best guess. A row whose layout is not published at all goes through
`fm plan search --top 1`, then `fm plan estimate` on what it chose. Rows the command line
cannot state (literature.PublishedRun.not_expressible) are predicted with the nearest
setting and kept out of the headline figures.

Errors are in MFU points, + when the planner is optimistic: a published time or throughput
is turned into the MFU the planner's own FLOP count gives it (the same FLOPs on both sides),
an FP8 / BF16 ratio into the FP8 run's MFU over the BF16 baseline's. Memory rows are a
relative error. Production runs (whole-run GPU-hours, MT-NLG's iteration with everything
around it) are reported in their own family, not in the headline.

The headline figures are the shipped model's, what a user gets. Held out by construction:
the cost model's three chosen constants (compute.K_HALF, compute.ELEMENTWISE_PASSES,
step.EP_OVERLAP_1F1B) are also fitted here, on a grid, to the declared tuning rows only
(PublishedRun.tuning), every other row predicted with them frozen (`fitted_*`).
Leave-one-source-out: each publication is predicted with the constants fitted on the tuning
rows of every other one (one outside the tuning set is held out already).
`shipped_constants_are_the_fit` says whether the package ships that fit.

Last stdout line: JSON.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.planner import compute, step
from fm_pipeline.planner.calibration import eq3_flops
from fm_pipeline.planner.evidence import published_family
from fm_pipeline.planner.literature import PUBLISHED_RUNS, PublishedRun
from fm_pipeline.planner.shape import named_shape

TARGETS = {"median_abs_err_pts": 3.0, "max_abs_err_pts": 6.0, "loso_median_abs_err_pts": 4.0,
           "torchtitan_tok_s_err": 0.10, "torchtitan_memory_err": 0.10}
# The grid the constants are fitted on (the shipped values are on it).
GRID = {"K_HALF": (128, 192, 256, 384, 512, 768, 1024),
        "ELEMENTWISE_PASSES": (1.0, 1.5, 2.0, 2.5, 3.0),
        "EP_OVERLAP_1F1B": (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9)}
OWNER = {"K_HALF": compute, "ELEMENTWISE_PASSES": compute, "EP_OVERLAP_1F1B": step}
SHAPE_FLAGS = ("route_nodes", "qk_head_dim", "v_head_dim", "expert_imbalance", "vocab")


def shipped() -> dict[str, float]:
    return {name: getattr(OWNER[name], name) for name in GRID}


@contextlib.contextmanager
def constants(values: dict[str, float]):
    """The cost model with these constants, restored after (the command reads them at call
    time, in this process)."""
    before = shipped()
    try:
        for name, value in values.items():
            setattr(OWNER[name], name, value)
        yield
    finally:
        for name, value in before.items():
            setattr(OWNER[name], name, value)


def layout_text(run: PublishedRun) -> str:
    """The published layout as `fm plan search` prints one (layout.parse_layout)."""
    p = run.pinned
    parts = [f"tp={run.tp}", f"pp={run.pp}", f"dp={run.dp}", f"cp={run.cp}",
             f"ep={p.get('ep', 1)}", f"mb={p.get('micro_batch', 1)}",
             f"v={p.get('virtual_stages', 1)}", f"recompute={p.get('recompute', 'none')}"]
    sharding = p.get("sharding", "fsdp")
    shard = p.get("dp_shard", 0)
    return " ".join(parts + [f"{sharding}/{shard}" if shard else sharding])


def common_argv(run: PublishedRun, precision: str | None = None) -> list[str]:
    """What every command for this row says: the model, the batch, the cluster, the knobs."""
    argv = ["--model", run.model, "--seq-len", str(run.seq_len), "--gpus", str(run.gpus),
            "--gpu-type", run.gpu_type, "--precision", precision or run.precision,
            "--global-batch-tokens", str(run.global_batch * run.seq_len), "--json",
            "--sequence-parallel" if run.sequence_parallel else "--no-sequence-parallel",
            "--tp-overlap" if run.tp_overlap else "--no-tp-overlap",
            "--dp-overlap" if run.dp_overlap else "--no-dp-overlap",
            "--ep-overlap", run.ep_overlap]
    if run.inter_node_gbps:
        argv += ["--inter-node-gbps", str(run.inter_node_gbps)]
    if run.training_tokens:
        argv += ["--training-tokens", str(run.training_tokens)]
    for name, value in run.shape_overrides.items():
        if name not in SHAPE_FLAGS:
            raise ValueError(f"{run.key}: {name} has no command-line flag")
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


class Cli:
    """`fm` in this process: the same commands a user types, without a Python start each."""

    def __init__(self):
        from typer.testing import CliRunner

        from fm_pipeline.cli.main import app

        self.app, self.runner, self.calls = app, CliRunner(), 0

    def __call__(self, *argv: str) -> dict:
        self.calls += 1
        result = self.runner.invoke(self.app, list(argv))
        if result.exit_code != 0:
            raise RuntimeError(f"fm {' '.join(argv)}: exit {result.exit_code}: "
                               f"{result.output[-500:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


def source_of(run: PublishedRun) -> str:
    """The publication a row comes from (KOR22's Tables 3, 5 and its section 6.3: one)."""
    return run.source.split()[0]


@dataclass
class Fidelity:
    run: PublishedRun
    layout: str
    how: str  # "estimate" or "search, then estimate"
    mfu: float  # the planner's MFU of the row's run
    predicted: float  # in the row's metric
    err_pts: float | None  # MFU points, + optimistic (None: memory rows)
    rel_err: float  # relative, in the direction of throughput (memory: + more than measured)
    fits: bool

    @property
    def family(self) -> str:
        return "production" if self.run.production else source_of(self.run)


def predict(cli: Cli, run: PublishedRun) -> Fidelity:
    argv = common_argv(run)
    how = "estimate"
    if run.tp and run.pp and run.dp:
        layout = layout_text(run)
    else:  # the layout itself unpublished: the search picks it, as a user would
        found = cli("plan", "search", *argv, "--top", "1")
        layout, how = found["plans"][0]["describe"], "search, then estimate"
    est = cli("plan", "estimate", *argv, "--layout", layout)
    mfu, step_s = est["mfu"], est["step_time_s"]
    # Below, time_ratio = predicted / published time: the MFU the source implies is mfu x it.
    if run.metric == "memory_gib":
        predicted = est["memory_gib_per_gpu"]
        return Fidelity(run, layout, how, mfu, predicted, None, predicted / run.value - 1,
                        est["fits"])
    if run.metric == "fp8_speedup":
        bf16 = cli("plan", "estimate", *common_argv(run, "bf16"), "--layout", layout)
        predicted = bf16["step_time_s"] / step_s
        err = bf16["mfu"] * (predicted - run.value)  # FP8 MFU over BF16's, both ways
        return Fidelity(run, layout, how, mfu, predicted, 100 * err,
                        predicted / run.value - 1, est["fits"])
    if run.metric == "gpu_hours":
        predicted = (est["cost"]["gpu_hours"] if run.production else
                     run.training_tokens / (run.global_batch * run.seq_len) * step_s
                     * run.gpus / 3600)
        time_ratio = predicted / run.value
    elif run.metric == "iteration_s":
        predicted, time_ratio = step_s, step_s / run.value
    elif run.metric == "tflops_eq3":
        shape = named_shape(run.model, seq_len=run.seq_len)
        published_s = eq3_flops(shape, run.global_batch) / (run.value * 1e12 * run.gpus)
        predicted, time_ratio = eq3_flops(shape, run.global_batch) / step_s / run.gpus / 1e12, \
            step_s / published_s
    elif run.metric == "tokens_per_s_gpu":
        predicted = est["tokens_per_s"] / run.gpus
        time_ratio = run.value / predicted
    elif run.metric == "mfu":
        return Fidelity(run, layout, how, mfu, mfu, 100 * (mfu - run.value),
                        mfu / run.value - 1, est["fits"])
    else:
        raise ValueError(f"{run.key}: unknown metric {run.metric}")
    return Fidelity(run, layout, how, mfu, predicted, 100 * mfu * (1 - time_ratio),
                    1 / time_ratio - 1, est["fits"])


def implied_mfu(r: Fidelity) -> float:
    """The MFU the published figure implies with the planner's FLOP count."""
    return r.mfu - r.err_pts / 100


def speed_rows(rows: list[Fidelity]) -> list[Fidelity]:
    """The headline's rows: benchmarks the command line can state (not memory, not
    production)."""
    return [r for r in rows if r.err_pts is not None and not r.run.production
            and not r.run.not_expressible]


def median_abs(values) -> float | None:
    values = [abs(v) for v in values]
    return statistics.median(values) if values else None


def fit(cli: Cli, runs: list[PublishedRun]) -> tuple[dict[str, float], float | None]:
    """The grid point with the smallest mean |error| (MFU points) on these rows (the mean:
    a median over a handful of rows is moved by its middle row alone); ties go to the point
    nearest the shipped constants (a tuning set silent on a constant leaves it where it
    was). Returns the point and its mean |error|."""
    base = shipped()
    if not runs:
        return base, None
    best, best_key = base, None
    for values in itertools.product(*GRID.values()):
        point = dict(zip(GRID, values, strict=True))
        with constants(point):
            err = statistics.fmean(abs(predict(cli, r).err_pts) for r in runs)
        distance = sum(abs(point[k] / base[k] - 1) if base[k] else abs(point[k])
                       for k in point)
        key = (round(err, 6), distance)
        if best_key is None or key < best_key:
            best, best_key = point, key
    return best, best_key[0]


DOC_START = ("<!-- planner_fidelity: python -m benchmarks.planner_fidelity --doc "
             "docs/calibration-planner.md --from tests/bench_fixtures/planner_fidelity.json -->")
DOC_END = "<!-- end of planner_fidelity -->"


def _pts(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


def markdown(result: dict) -> str:
    """The benchmark's JSON as the calibration document shows it."""
    t = result["targets"]
    tuning = set(result["tuning_rows"])
    lines = [
        f"Measured {result.get('measured_on', 'today')}: {result['headline_rows']} benchmark "
        f"rows of {result['rows']} (memory, production and not-expressible rows apart).",
        "",
        "| figure | this model | target |", "| --- | ---: | ---: |",
        f"| median absolute error, MFU points | {result['median_abs_err_pts']:.1f} | "
        f"<= {t['median_abs_err_pts']:g} |",
        f"| max absolute error, MFU points | {result['max_abs_err_pts']:.1f} | "
        f"<= {t['max_abs_err_pts']:g} |",
        f"| leave-one-source-out median, MFU points | {result['loso_median_abs_err_pts']:.1f} | "
        f"<= {t['loso_median_abs_err_pts']:g} |",
        f"| torchtitan tokens/s per GPU, median relative | "
        f"{result['torchtitan_tok_s_err']:.1%} | <= {t['torchtitan_tok_s_err']:.0%} |",
        f"| torchtitan peak memory, median relative | {result['torchtitan_memory_err']:.1%} | "
        f"<= {t['torchtitan_memory_err']:.0%} |",
        f"| every published run fits | {'yes' if result['fits_all'] else 'no: ' + str(len(result['not_fitting'])) + ' do not'} | yes |",
        "",
        f"Constants fitted on the tuning rows ({len(tuning)}): "
        + ", ".join(f"`{k} = {v:g}`" for k, v in result["fitted_constants"].items())
        + f" ({'the shipped ones' if result['shipped_constants_are_the_fit'] else 'not the shipped ones'}); "
        f"with them the median is {result['fitted_median_abs_err_pts']:.1f} and the max "
        f"{result['fitted_max_abs_err_pts']:.1f} points.",
        "",
        "| family | median abs error (pts) | leave-one-source-out, refitted (pts) |",
        "| --- | ---: | ---: |",
    ]
    loso = result["per_family_loso_median_abs_err_pts"]
    for family, err in result["per_family_median_abs_err_pts"].items():
        lines.append(f"| {family} | {err:.1f} | "
                     f"{'n/a' if loso.get(family) is None else format(loso[family], '.1f')} |")
    lines += ["", "| run | family | role | metric | published | predicted | error (pts) "
              "| LOSO (pts) | fits | settings (`--layout`) |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in result["per_row"]:
        role = ("not expressible" if r["key"] in result["not_expressible"] else
                "tuning" if r["key"] in tuning else
                "production" if r["family"] == "production" else
                "memory" if r["metric"] == "memory_gib" else "held out")
        lines.append(f"| {r['key']} | {r['family']} | {role} | {r['metric']} | "
                     f"{r['published']:.4g} | {r['predicted']:.4g} | {_pts(r['err_pts'])} | "
                     f"{_pts(r['loso_err_pts'])} | {'yes' if r['fits'] else 'no'} | "
                     f"{r['layout']}{' (searched)' if r['how'] != 'estimate' else ''} |")
    return "\n".join(lines)


def with_doc(text: str, section: str) -> str:
    head, start, rest = text.partition(DOC_START)
    if not start:
        raise ValueError(f"no {DOC_START!r} in the document")
    _, end, tail = rest.partition(DOC_END)
    return f"{head}{DOC_START}\n{section}\n{DOC_END}{tail}"


def held_out(result: dict) -> dict:
    """What the planner ships (planner/held_out.json): per layout family, the held-out
    (leave-one-source-out) errors of its benchmark rows in MFU points, and the highest MFU
    a published dense BF16 run reached."""
    rows = [r for r in result["per_row"] if r["headline"] and r["loso_err_pts"] is not None]
    families: dict[str, list[float]] = {}
    for r in rows:
        if r["layout_family"]:
            families.setdefault(r["layout_family"], []).append(r["loso_err_pts"])
    dense = [r for r in result["per_row"] if r["dense_bf16_mfu"] is not None]
    top = max(dense, key=lambda r: r["dense_bf16_mfu"])
    return {
        "source": "python -m benchmarks.planner_fidelity --package-data "
                  "fm_pipeline/planner/held_out.json --from tests/bench_fixtures/"
                  "planner_fidelity.json",
        "measured_on": result.get("measured_on"),
        "all": {"rows": len(rows),
                "median_abs_err_pts": median_abs(r["loso_err_pts"] for r in rows)},
        "per_layout_family": {
            f: {"rows": len(errs), "median_abs_err_pts": median_abs(errs),
                "mean_signed_err_pts": statistics.fmean(errs)}
            for f, errs in sorted(families.items())},
        "best_dense_bf16": {"key": top["key"], "mfu": top["dense_bf16_mfu"]},
    }


def main() -> None:
    import argparse

    from rich.progress import Progress

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, help="rewrite this document's fidelity section")
    parser.add_argument("--from", dest="source", type=Path,
                        help="a saved JSON line instead of running the benchmark")
    parser.add_argument("--package-data", type=Path,
                        help="write the held-out errors the planner ships here")
    args = parser.parse_args()
    if args.source:
        result = json.loads(args.source.read_text().strip().splitlines()[-1])
        if args.doc:
            args.doc.write_text(with_doc(args.doc.read_text(), markdown(result)))
            print(f"{args.doc}: fidelity section rendered from {args.source}")
        if args.package_data:
            args.package_data.write_text(json.dumps(held_out(result), indent=1) + "\n")
            print(f"{args.package_data}: held-out errors from {args.source}")
        return

    started = time.perf_counter()
    cli = Cli()
    tuning = [r for r in PUBLISHED_RUNS if r.tuning]
    with Progress(transient=True) as progress:
        progress.add_task("fitting the constants on the tuning rows", total=None)
        fitted, tuning_err = fit(cli, tuning)
    rows = [predict(cli, r) for r in PUBLISHED_RUNS]  # what a user gets: the shipped model
    with constants(fitted):
        fit_rows = [predict(cli, r) for r in PUBLISHED_RUNS]
    # Leave one source out (a paper, all its tables): refit without its tuning rows,
    # predict it with what the others gave.
    loso: dict[str, float] = {}
    for source in sorted({source_of(r.run) for r in fit_rows}):
        own = [r for r in fit_rows if source_of(r.run) == source]
        if not any(r.run.tuning for r in own):
            loso.update({r.run.key: r.err_pts for r in own if r.err_pts is not None})
            continue
        without, _ = fit(cli, [t for t in tuning if source_of(t) != source])
        with constants(without):
            loso.update({r.run.key: predict(cli, r.run).err_pts for r in own
                         if r.err_pts is not None})
    speed = speed_rows(rows)
    headline = {r.run.key for r in speed}
    families: dict[str, list[Fidelity]] = {}
    for r in rows:
        if r.err_pts is not None:
            families.setdefault(r.family, []).append(r)
    titan_tps = [r for r in rows if r.run.metric == "tokens_per_s_gpu"
                 and r.run.source.startswith("TITAN") and not r.run.not_expressible]
    titan_mem = [r for r in rows if r.run.metric == "memory_gib"
                 and r.run.source.startswith("TITAN")]
    result = {
        "benchmark": "planner_fidelity",
        "rows": len(rows),
        "headline_rows": len(speed),
        "median_abs_err_pts": median_abs(r.err_pts for r in speed),
        "max_abs_err_pts": max(abs(r.err_pts) for r in speed),
        "mean_signed_err_pts": statistics.fmean(r.err_pts for r in speed),
        "loso_median_abs_err_pts": median_abs(loso[r.run.key] for r in speed),
        # The same rows with the constants fitted here (the LOSO figures' base).
        "fitted_median_abs_err_pts": median_abs(r.err_pts for r in speed_rows(fit_rows)),
        "fitted_max_abs_err_pts": max(abs(r.err_pts) for r in speed_rows(fit_rows)),
        "per_family_median_abs_err_pts": {
            f: median_abs(r.err_pts for r in group) for f, group in sorted(families.items())},
        "per_family_loso_median_abs_err_pts": {
            f: median_abs(loso[r.run.key] for r in group) for f, group in sorted(families.items())
            if all(r.run.key in loso for r in group)},
        "fits_all": all(r.fits for r in rows if r.run.metric != "memory_gib"),
        "not_fitting": [r.run.key for r in rows if not r.fits and r.run.metric != "memory_gib"],
        "torchtitan_tok_s_err": median_abs(r.rel_err for r in titan_tps),
        "torchtitan_memory_err": median_abs(r.rel_err for r in titan_mem),
        "not_expressible": {r.run.key: r.run.not_expressible for r in rows
                            if r.run.not_expressible},
        "tuning_rows": [r.key for r in tuning],
        "fitted_constants": fitted,
        "tuning_mean_abs_err_pts": tuning_err,
        "shipped_constants_are_the_fit": fitted == shipped(),
        "targets": TARGETS,
        "per_row": [{"key": r.run.key, "family": r.family, "metric": r.run.metric,
                     "layout_family": published_family(r.run),
                     "headline": r.run.key in headline,
                     # the MFU the source implies, for dense BF16 benchmark rows
                     "dense_bf16_mfu": implied_mfu(r) if (
                         r.run.key in headline and r.run.precision == "bf16"
                         and "experts" not in r.run.pinned and "ep" not in r.run.pinned
                         and r.run.metric != "fp8_speedup") else None,
                     "published": r.run.value, "predicted": r.predicted, "mfu": r.mfu,
                     "err_pts": r.err_pts, "loso_err_pts": loso.get(r.run.key),
                     "rel_err": r.rel_err, "fits": r.fits, "how": r.how,
                     "layout": r.layout} for r in rows],
        "cli_calls": cli.calls,
        "wall_s": time.perf_counter() - started,
    }
    for r in sorted(speed, key=lambda r: -abs(r.err_pts))[:10]:
        print(f"{r.run.key:40s} {r.err_pts:+6.1f} pts  ({r.layout})")
    if args.doc:
        args.doc.write_text(with_doc(args.doc.read_text(), markdown(result)))
    if args.package_data:
        args.package_data.write_text(json.dumps(held_out(result), indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
