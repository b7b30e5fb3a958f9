"""Where chaos runs happen: an FM_HOME of their own, the small real data mix, jobs sized for
fault injection on a 2-core machine, and what a job left behind (segments, checkpoints).

    ws = ChaosWorkspace(Path(".fm/chaos/20260101T120000"))   # ws.site: its state
    with ws.active():                                # one thread per rank meanwhile
        job = ws.job("chaos-kill-rank")              # 2 ranks, 8 steps, checkpoint every 2
        ws.prepare(job)                              # the mix, once per store
        ws.segments(job.name)                        # segments.jsonl records
        ws.newest_valid(job)                         # step of the newest valid checkpoint

The jobs use the debug model on the data team's small mix (fm_pipeline.data.testing):
a segment costs about a torchrun start-up plus a second of training.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from fm_pipeline.config import JobSpec
from fm_pipeline.config.site import Site
from fm_pipeline.rundir.records import SEGMENTS_FILE, read_records

# Sized so that faults land between checkpoints and a hang is detected in seconds.
CHAOS_JOB: dict[str, Any] = {
    "parallelism.nproc_per_node": 2,
    "training.steps": 8, "training.segment_steps": 8, "training.warmup_steps": 1,
    "training.rank_timings_every": 1,
    "training.preemption_grace_s": 3,  # torchrun's --shutdown-timeout = grace + 5 s
    "checkpoint.every_steps": 2, "checkpoint.keep_last": 3, "checkpoint.upload": False,
    "resilience.collective_timeout_s": 15,
}


class ChaosWorkspace:
    def __init__(self, home: Path):
        self.home = Path(home).resolve()
        self.site = Site.at(self.home)  # what this workspace's runs and checks are given
        self._prepared: set[tuple[str, str]] = set()

    @contextlib.contextmanager
    def active(self):
        """The workspace for the block: its home exists, and the ranks of the processes it
        starts use one thread each (a 2-core machine). Where state lives is `self.site`,
        handed to what runs here, never read back from the environment."""
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.home.mkdir(parents=True, exist_ok=True)
        try:
            yield self
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)

    @property
    def store_dir(self) -> Path:
        return self.home / "store"

    def job(self, name: str, **overrides: Any) -> JobSpec:
        """A chaos job with nothing left of an earlier run of it in this workspace."""
        from fm_pipeline.data.testing import small_job

        shutil.rmtree(self.site.runs_dir(name), ignore_errors=True)
        return small_job(**{**CHAOS_JOB, "name": name, **overrides})

    def prepare(self, job: JobSpec, store=None):
        """The job's data mix in `store` (default: this workspace's), built once."""
        from fm_pipeline.data import mix_key
        from fm_pipeline.data.testing import build_small_mix

        store = store or self.site.store()
        key = (store.uri, mix_key(job))
        if key not in self._prepared:
            build_small_mix(job, store=store)
            self._prepared.add(key)
        from fm_pipeline.data import open_mix

        return open_mix(store, key[1], cache_dir=self.site.data_cache(key[1]))

    def pod_segment(self, job: JobSpec, label: str):
        """(the job's whole run rendered as a JobSet with a shared claim, a fresh directory
        for its pods under this workspace), the mix prepared: for PodNodes."""
        import time

        from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
        from fm_pipeline.launch.spec import SegmentLaunch

        self.prepare(job)
        rendered = render_segment(SegmentLaunch(job, end_step=job.training.steps),
                                  KubernetesTarget(store_uri="s3://unused/fm",
                                                   shared_volume_claim="fm-runs"))
        root = self.home / "pods" / f"{label}-{time.time_ns()}"
        root.mkdir(parents=True)
        return rendered, root

    def segments(self, job_name: str, *, since: float = 0.0) -> list[dict]:
        return [r for r in read_records(self.site.runs_dir(job_name) / SEGMENTS_FILE, "segment")
                if r.get("time", 0) >= since]

    def newest_valid(self, job: JobSpec) -> tuple[int | None, list[str]]:
        """(step of the newest valid checkpoint or None, why newer ones were skipped)."""
        from fm_pipeline.catalog import latest_valid

        found = latest_valid(job, store=None, root=self.site.checkpoints_dir(job.name))
        return (found.found.step if found.found else None), found.skipped_lines()

    def checkpoint_dir(self, job_name: str, step: int) -> Path:
        return self.site.checkpoints_dir(job_name) / f"step-{step:08d}"

    def snapshot(self, job_name: str, label: str) -> Path:
        """Copy the job's runs directory aside (to rerun faults from the same state)."""
        dest = self.home / "snapshots" / f"{job_name}-{label}"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.site.runs_dir(job_name), dest)
        return dest

    def restore_snapshot(self, job_name: str, label: str) -> None:
        src = self.home / "snapshots" / f"{job_name}-{label}"
        shutil.rmtree(self.site.runs_dir(job_name), ignore_errors=True)
        shutil.copytree(src, self.site.runs_dir(job_name))
