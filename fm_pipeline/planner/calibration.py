"""Predicted vs published for the runs in `literature.py`, with one set of constants.

    python -m fm_pipeline.planner.calibration            # markdown table
    python -m fm_pipeline.planner.calibration --json
    python -m fm_pipeline.planner.calibration --plot docs/img/planner-calibration.png

For each run, the published degrees and settings are pinned and the planner's search fills
in what the paper does not say (micro-batch size, interleaving, recomputation, sharding),
exactly as it would for a user. The prediction is converted to the paper's metric.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import Candidates, Layout
from fm_pipeline.planner.literature import PUBLISHED_RUNS, PublishedRun
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import named_shape
from fm_pipeline.planner.step import evaluate
from fm_pipeline.plotting import save_figure


@dataclass
class CalibrationRow:
    run: PublishedRun
    predicted: float | None  # None: nothing fits with the published degrees
    layout: str
    mfu: float | None
    fits: bool = True  # the published configuration fits in the planner's memory model

    @property
    def error(self) -> float | None:
        """Signed relative error of the prediction, in the direction of throughput (of memory
    for memory rows: + is more than measured)."""
        if self.predicted is None:
            return None
        if self.run.metric in ("iteration_s", "gpu_hours"):
            return self.run.value / self.predicted - 1
        return self.predicted / self.run.value - 1


def eq3_flops(shape, batch: int) -> float:
    """Narayanan et al. 2021 eq. (3): FLOPs of one iteration with full recomputation."""
    lay, h, s, v = shape.layers, shape.hidden, shape.seq_len, shape.vocab
    return 96 * batch * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))


def predict_run(run: PublishedRun) -> CalibrationRow:
    shape = dataclasses.replace(named_shape(run.model, seq_len=run.seq_len),
                                **run.shape_overrides)
    cluster = make_cluster(run.gpu_type, inter_node_gbps=run.inter_node_gbps)
    # A degree of 0: not published, the search chooses it.
    fixed = {k: v for k, v in (("tp", run.tp), ("pp", run.pp), ("dp", run.dp), ("cp", run.cp))
             if v} | run.pinned
    if run.metric == "memory_gib":  # every field pinned: the memory, fitting or not
        est = estimate(shape, cluster, Layout(**fixed), precision=run.precision,
                       global_batch_tokens=run.global_batch * run.seq_len)
        return CalibrationRow(run=run, predicted=est.metrics["memory_gib_per_gpu"],
                              layout=est.layout.describe(), mfu=est.metrics["mfu"],
                              fits=est.fits)
    batch_tokens = run.global_batch * run.seq_len
    result = search(
        shape,
        cluster,
        gpus=run.gpus,
        global_batch_tokens=batch_tokens,
        top=1,
        fixed=fixed,
        precision=run.precision,
        dp_overlap=run.dp_overlap,
        ep_overlap=run.ep_overlap,
        sequence_parallel=run.sequence_parallel,
        tp_overlap=run.tp_overlap,
        runnable_only=False,  # the published runs' own layouts (ZeRO-1, cp, uneven stages)
    )
    if not result.plans and not _whole(fixed):
        return CalibrationRow(run=run, predicted=None, layout="nothing fits", mfu=None,
                              fits=False)
    if not result.plans:  # the published layout, whole, over the planner's memory: its time
        est = estimate(shape, cluster, Layout(**fixed), global_batch_tokens=batch_tokens,
                       precision=run.precision, dp_overlap=run.dp_overlap,
                       ep_overlap=run.ep_overlap, sequence_parallel=run.sequence_parallel,
                       tp_overlap=run.tp_overlap)
        best, m, fits = est.layout, est.metrics, False
    else:
        best, fits = result.plans[0].layout, True
        m = result.metrics(result.plans[0].index)
    if run.metric == "fp8_speedup":
        # The same layout in BF16, as the paper's baseline ran it.
        bf16 = evaluate(shape, cluster, Candidates.from_layouts([best]),
                        global_batch_tokens=batch_tokens, dp_overlap=run.dp_overlap,
                        sequence_parallel=run.sequence_parallel, tp_overlap=run.tp_overlap)
        predicted = float(bf16.step_time_s[0]) / m["step_time_s"]
    elif run.metric == "gpu_hours" and run.production:  # whole runs: with the goodput
        predicted = estimate(shape, cluster, best, global_batch_tokens=batch_tokens,
                             training_tokens=run.training_tokens, precision=run.precision,
                             dp_overlap=run.dp_overlap, ep_overlap=run.ep_overlap,
                             sequence_parallel=run.sequence_parallel,
                             tp_overlap=run.tp_overlap).cost.gpu_hours
    elif run.metric == "gpu_hours":  # compute hours: every step at the predicted step time
        steps = run.training_tokens / batch_tokens
        predicted = steps * m["step_time_s"] * run.gpus / 3600
    elif run.metric == "tflops_eq3":
        predicted = eq3_flops(shape, run.global_batch) / m["step_time_s"] / run.gpus / 1e12
    elif run.metric == "iteration_s":
        predicted = m["step_time_s"]
    elif run.metric == "tokens_per_s_gpu":
        predicted = m["tokens_per_s"] / run.gpus
    else:
        predicted = m["mfu"]
    return CalibrationRow(run=run, predicted=predicted, layout=best.describe(), mfu=m["mfu"],
                          fits=fits)


def _whole(fixed: dict) -> bool:
    """Every field of the layout published: nothing left for the search to choose."""
    return {"tp", "pp", "dp", "ep", "micro_batch", "recompute", "sharding"} <= set(fixed) and (
        fixed["pp"] == 1 or "virtual_stages" in fixed)


def calibrate(runs: list[PublishedRun] | None = None) -> list[CalibrationRow]:
    return [predict_run(r) for r in (runs or PUBLISHED_RUNS)]


def _errors(rows: list[CalibrationRow]) -> dict:
    errors = [abs(r.error) for r in rows if r.error is not None]
    if not errors:
        return {"runs": len(rows), "predicted": 0}
    return {
        "runs": len(rows),
        "predicted": len(errors),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "mean_signed_error": statistics.fmean(r.error for r in rows if r.error is not None),
        "within_15pct": sum(e <= 0.15 for e in errors),
    }


def summary(rows: list[CalibrationRow]) -> dict:
    """Benchmark rows (tuning and validation apart) and production runs apart: the two
    chosen constants were picked on the tuning rows, so only the rest validates them."""
    memory = [r for r in rows if r.run.metric == "memory_gib"]
    speed = [r for r in rows if r.run.metric != "memory_gib"]
    benchmarks = [r for r in speed if not r.run.production]
    return {
        **_errors(benchmarks),
        "tuning": _errors([r for r in benchmarks if r.run.tuning]),
        "validation": _errors([r for r in benchmarks if not r.run.tuning]),
        "production": _errors([r for r in speed if r.run.production]),
        "fp8": _errors([r for r in benchmarks if r.run.precision.startswith("fp8")]),
        "memory": _errors(memory),
    }


def by_source(rows: list[CalibrationRow]) -> dict[str, dict]:
    out: dict[str, list[CalibrationRow]] = {}
    for r in rows:
        out.setdefault(r.run.source, []).append(r)
    return {source: _errors(group) for source, group in out.items()}


UNITS = {"tflops_eq3": "TFLOP/s/GPU", "iteration_s": "s/iteration", "mfu": "MFU",
         "fp8_speedup": "FP8 / BF16 tokens/s", "gpu_hours": "GPU-hours",
         "memory_gib": "GiB per GPU", "tokens_per_s_gpu": "tokens/s per GPU"}


def _role(run: PublishedRun) -> str:
    if run.metric == "memory_gib":
        return "memory"
    return "production" if run.production else "tuning" if run.tuning else "validation"


def markdown(rows: list[CalibrationRow]) -> str:
    lines = [
        ("| run | source | role | GPUs | tp/pp/dp/cp | precision | metric | published "
         "| predicted | error | fits | planner's choice |"),
        "| --- | --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        run = r.run
        pred = "n/a" if r.predicted is None else f"{r.predicted:.3g}"
        err = "n/a" if r.error is None else f"{r.error:+.0%}"
        lines.append(
            f"| {run.key} | {run.source} | {_role(run)} | {run.gpus} | "
            f"{run.tp}/{run.pp}/{run.dp}/{run.cp} | {run.precision} | {UNITS[run.metric]} | "
            f"{run.value:.3g} | {pred} | {err} | {'yes' if r.fits else 'no'} | {r.layout} |"
        )
    return "\n".join(lines)


def markdown_summary(rows: list[CalibrationRow]) -> str:
    """Per source, then tuning / validation / production / FP8: runs, median and max error."""
    lines = ["| rows | runs | median abs error | max abs error | mean signed |",
             "| --- | ---: | ---: | ---: | ---: |"]
    groups = [*by_source(rows).items(),
              *((f"**{k}**", v) for k, v in summary(rows).items() if isinstance(v, dict))]
    for name, e in groups:
        if e.get("predicted"):
            lines.append(f"| {name} | {e['predicted']} | {e['median_abs_error']:.0%} | "
                         f"{e['max_abs_error']:.0%} | {e['mean_signed_error']:+.0%} |")
    return "\n".join(lines)


def plot(rows: list[CalibrationRow], out: Path) -> Path:
    """Predicted over published step time against GPU count, one point per run (memory
    rows are not throughput: left out)."""
    rows = [r for r in rows if r.run.metric != "memory_gib"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    ax.axhspan(1 / 1.15, 1.15, color="g", alpha=0.1, label="within 15%")
    ax.axhline(1.0, color="k", lw=0.8)
    markers = {"nar21": "o", "kor22": "s", "mtnlg22": "^", "llama3": "*", "dgxc24": "D",
               "titan24": "P", "titan25": "X", "dsv3": "h", "mbridge25": "v", "moezoo25": "p"}
    for source, marker in markers.items():
        pts = [
            (r.run.gpus, 1 / (1 + r.error))
            for r in rows
            if r.error is not None and r.run.key.startswith(source + "-")
        ]
        if not pts:
            continue
        gpus, ratio = zip(*pts, strict=True)
        ax.scatter(gpus, ratio, marker=marker, s=60 if marker == "*" else 30, label=source,
                   alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("predicted / published step time\n(FP8 ratio rows: published / predicted)")
    ax.set_ylim(0.5, 1.7)
    ax.set_title("Planner vs published runs (one set of constants, no per-row tuning)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, help="also write a PNG of predicted / published")
    args = parser.parse_args()
    rows = calibrate()
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(
            json.dumps(
                {
                    "rows": [
                        {
                            "key": r.run.key,
                            "role": _role(r.run),
                            "precision": r.run.precision,
                            "published": r.run.value,
                            "predicted": r.predicted,
                            "error": r.error,
                            "fits": r.fits,
                            "layout": r.layout,
                        }
                        for r in rows
                    ],
                    "summary": summary(rows),
                }
            )
        )
    else:
        print(markdown(rows))
        print()
        print(markdown_summary(rows))


if __name__ == "__main__":
    main()
