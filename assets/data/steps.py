"""What the data area's ops share: run-log progress, a step's peak memory, mapping keys, how
many steps share the machine."""

import os
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


def concurrent_steps(context: OpExecutionContext) -> int | None:
    """How many steps of this run the multiprocess executor runs side by side on this
    machine (its max_concurrent); None under any other executor (in-process: one step at
    a time; Kubernetes: each step a pod with cores of its own)."""
    multiprocess = (context.run_config.get("execution") or {}).get("config", {}).get("multiprocess")
    if multiprocess is None:
        return None
    return multiprocess.get("max_concurrent") or os.cpu_count()


def mapping_key(name: str) -> str:
    """A task's name as a Dagster dynamic mapping key (letters, digits, underscores)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def peak_rss_mib() -> float:
    """The peak resident memory of the process running the step, MiB (ru_maxrss is KiB on
    Linux): per task under the multiprocess executor, the whole run's under in-process."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
