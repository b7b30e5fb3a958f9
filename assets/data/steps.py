"""What the data area's ops share: run-log progress, a step's peak memory, mapping keys."""

import re
import resource

from dagster import AssetExecutionContext, OpExecutionContext

from fm_pipeline.data.progress import ProgressSink


class LogProgress(ProgressSink):
    """Pipeline progress as run log lines (the UI shows them under each step)."""

    def __init__(self, context: AssetExecutionContext | OpExecutionContext):
        self._log = context.log

    def start(self, task: str, *, total=None, unit: str = "") -> None:
        self._log.info(f"{task}: started" + (f" ({total:,} {unit})" if total else ""))

    def finish(self, task: str, summary: str = "") -> None:
        self._log.info(f"{task}: {summary or 'done'}")


def mapping_key(name: str) -> str:
    """A task's name as a Dagster dynamic mapping key (letters, digits, underscores)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def peak_rss_mib() -> float:
    """The peak resident memory of the process running the step, MiB (ru_maxrss is KiB on
    Linux): per task under the multiprocess executor, the whole run's under in-process."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
