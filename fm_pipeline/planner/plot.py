"""Predicted MFU against GPU count, for docs/img/planner-mfu-vs-gpus.png.

    python -m fm_pipeline.planner.plot [--out docs/img/planner-mfu-vs-gpus.png]

Llama 3 405B at a fixed 16M-token global batch on H100s, from 1,024 to 65,536 GPUs: the
planner's best layout at each count, the published layout grown by data parallelism
(tp8 pp16, 4 virtual stages, every other layer recomputed), and the two 8K-context MFUs the
Llama 3 paper reports (Table 4) for reference.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fm_pipeline.planner.cluster import make_cluster
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import named_shape
from fm_pipeline.plotting import save_figure

GPU_COUNTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
BATCH = 16 * 2**20
PUBLISHED = {8192: 0.43, 16384: 0.41}  # Llama 3 paper, Table 4 (8K context)


def series():
    shape = named_shape("llama3-405b", seq_len=8192)
    cluster = make_cluster("h100")
    best, fixed = [], []
    for n in GPU_COUNTS:
        result = search(shape, cluster, gpus=n, global_batch_tokens=BATCH, top=1)
        best.append(result.metrics(result.plans[0].index)["mfu"] if result.plans else None)
        try:
            est = estimate(shape, cluster, Layout(tp=8, pp=16, dp=n // 128, virtual_stages=4,
                                                  recompute="half"), global_batch_tokens=BATCH)
            fixed.append(est.metrics["mfu"] if est.fits else None)
        except PlanInputError:
            fixed.append(None)  # the batch no longer fills the pipeline
    return best, fixed


def plot(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best, fixed = series()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(GPU_COUNTS, [b if b is not None else float("nan") for b in best], "o-",
            label="planner's best layout at each count")
    ax.plot(GPU_COUNTS, [f if f is not None else float("nan") for f in fixed], "s--",
            label="tp8 pp16 v4, dp grown (Llama 3's layout)")
    ax.plot(list(PUBLISHED), list(PUBLISHED.values()), "k*", markersize=12,
            label="published (Llama 3, Table 4)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(GPU_COUNTS, [f"{n // 1024}K" for n in GPU_COUNTS])
    ax.set_ylim(0, 0.7)
    ax.set_xlabel("H100 GPUs (16M-token global batch)")
    ax.set_ylabel("predicted MFU")
    ax.set_title("Llama 3 405B: predicted MFU vs GPU count")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    return save_figure(fig, out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/planner-mfu-vs-gpus.png"))
    print(plot(parser.parse_args().out))


if __name__ == "__main__":
    main()
