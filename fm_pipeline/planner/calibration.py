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
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.literature import PUBLISHED_RUNS, PublishedRun
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import named_shape


@dataclass
class CalibrationRow:
    run: PublishedRun
    predicted: float | None  # None: nothing fits with the published degrees
    layout: str
    mfu: float | None

    @property
    def error(self) -> float | None:
        """Signed relative error of the prediction, in the direction of throughput."""
        if self.predicted is None:
            return None
        if self.run.metric == "iteration_s":
            return self.run.value / self.predicted - 1
        return self.predicted / self.run.value - 1


def eq3_flops(shape, batch: int) -> float:
    """Narayanan et al. 2021 eq. (3): FLOPs of one iteration with full recomputation."""
    lay, h, s, v = shape.layers, shape.hidden, shape.seq_len, shape.vocab
    return 96 * batch * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))


def predict_run(run: PublishedRun) -> CalibrationRow:
    shape = named_shape(run.model, seq_len=run.seq_len)
    cluster = make_cluster(run.gpu_type, inter_node_gbps=run.inter_node_gbps)
    fixed = {"tp": run.tp, "pp": run.pp, "dp": run.dp, "cp": run.cp, **run.pinned}
    result = search(
        shape,
        cluster,
        gpus=run.gpus,
        global_batch_tokens=run.global_batch * run.seq_len,
        top=1,
        fixed=fixed,
        dp_overlap=run.dp_overlap,
        runnable_only=False,  # the published runs' own layouts (ZeRO-1, cp, uneven stages)
    )
    if not result.plans:
        return CalibrationRow(run=run, predicted=None, layout="nothing fits", mfu=None)
    best = result.plans[0]
    m = result.metrics(best.index)
    if run.metric == "tflops_eq3":
        predicted = eq3_flops(shape, run.global_batch) / m["step_time_s"] / run.gpus / 1e12
    elif run.metric == "iteration_s":
        predicted = m["step_time_s"]
    else:
        predicted = m["mfu"]
    return CalibrationRow(run=run, predicted=predicted, layout=best.layout.describe(), mfu=m["mfu"])


def calibrate(runs: list[PublishedRun] | None = None) -> list[CalibrationRow]:
    return [predict_run(r) for r in (runs or PUBLISHED_RUNS)]


def summary(rows: list[CalibrationRow]) -> dict:
    errors = [abs(r.error) for r in rows if r.error is not None]
    signed = [r.error for r in rows if r.error is not None]
    return {
        "runs": len(rows),
        "predicted": len(errors),
        "median_abs_error": statistics.median(errors),
        "mean_signed_error": statistics.fmean(signed),
        "max_abs_error": max(errors),
        "within_15pct": sum(e <= 0.15 for e in errors),
    }


UNITS = {"tflops_eq3": "TFLOP/s/GPU", "iteration_s": "s/iteration", "mfu": "MFU"}


def markdown(rows: list[CalibrationRow]) -> str:
    lines = [
        "| run | source | GPUs | tp/pp/dp/cp | metric | published | predicted | error "
        "| planner's choice |",
        "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        run = r.run
        pred = "n/a" if r.predicted is None else f"{r.predicted:.3g}"
        err = "n/a" if r.error is None else f"{r.error:+.0%}"
        lines.append(
            f"| {run.key} | {run.source} | {run.gpus} | {run.tp}/{run.pp}/{run.dp}/{run.cp} | "
            f"{UNITS[run.metric]} | {run.value:.3g} | {pred} | {err} | {r.layout} |"
        )
    return "\n".join(lines)


def plot(rows: list[CalibrationRow], out: Path) -> Path:
    """Predicted over published step time against GPU count, one point per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.axhspan(1 / 1.15, 1.15, color="g", alpha=0.1, label="within 15%")
    ax.axhline(1.0, color="k", lw=0.8)
    for source, marker in (("nar21", "o"), ("kor22", "s"), ("mtnlg22", "^"), ("llama3", "*")):
        pts = [
            (r.run.gpus, 1 / (1 + r.error))
            for r in rows
            if r.error is not None and r.run.key.startswith(source)
        ]
        gpus, ratio = zip(*pts, strict=True)
        ax.scatter(gpus, ratio, marker=marker, s=60 if marker == "*" else 30, label=source,
                   alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("predicted / published step time")
    ax.set_ylim(0.5, 1.3)
    ax.set_title("Planner vs published runs (one set of constants, no per-row tuning)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


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
                            "published": r.run.value,
                            "predicted": r.predicted,
                            "error": r.error,
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
        print(json.dumps(summary(rows)))


if __name__ == "__main__":
    main()
