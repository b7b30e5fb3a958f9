"""Writing a matplotlib figure to a PNG, the same way for every plot of the project."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: str | Path, *, dpi: int) -> Path:
    """Lay out, write (creating the folder) and close `fig`; returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)  # figures stay in pyplot's registry until closed
    return path
