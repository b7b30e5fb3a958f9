"""What cleaning removed, per source and reason, as a PNG (matplotlib, Agg backend).

    from fm_pipeline.data.plots import plot_cleaning
    plot_cleaning(manifest_sources_counts, "out/cleaning.png")   # {source: DocumentCounts}
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fm_pipeline.plotting import save_figure  # noqa: E402


def plot_cleaning(counts: dict, path: str | Path) -> Path:
    """One horizontal bar per source: documents kept (grey), then each drop reason, as
    shares of the documents read (each source's label says how many were read)."""
    reasons = sorted({r for c in counts.values() for r in c.dropped})
    labels = [f"{name}\n{c.read:,} read" for name, c in counts.items()]
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.6 * len(counts)))
    palette = plt.get_cmap("tab10")
    left = [0.0] * len(counts)
    for i, label in enumerate(["kept", *reasons]):
        shares = [(c.kept if label == "kept" else c.dropped.get(label, 0)) / max(c.read, 1)
                  for c in counts.values()]
        ax.barh(labels, shares, left=left, label=label,
                color="#bbbbbb" if label == "kept" else palette((i - 1) % 10))
        left = [a + b for a, b in zip(left, shares, strict=True)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of documents read")
    ax.set_title("cleaning: kept and dropped, by reason")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return save_figure(fig, path, dpi=100)
