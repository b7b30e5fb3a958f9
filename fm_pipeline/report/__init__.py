"""Reports of a training job read back from its run directory: the history of its launches
(kept and lost steps, checkpoints, evaluations) and one PNG figure of it.

    fm report demo-1                                   # the figure + a short summary
    from fm_pipeline.report import read_run_history, plot_training

The plotting module imports matplotlib, so it is loaded only when plotting.
"""

from fm_pipeline.report.run_history import (
    Checkpoint,
    Launch,
    NoMetrics,
    RunHistory,
    read_run_history,
)


def plot_training(history, path):
    """Write the figure of `history` to `path` (PNG); returns the path."""
    from fm_pipeline.report.training_plot import plot_training as plot

    return plot(history, path)


__all__ = ["Checkpoint", "Launch", "NoMetrics", "RunHistory", "plot_training", "read_run_history"]
