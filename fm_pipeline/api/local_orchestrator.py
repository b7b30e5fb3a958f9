"""The orchestrator on one machine: a run is a thread that launches the job's torchrun
segments one after another (`fm_pipeline.launch.run_segment_locally`) until the job's
target step, a failure, or a stop. The Dagster orchestrator replaces it at scale; both
answer the same `Orchestrator` interface.

Each segment leaves its evidence under runs_dir(job)/segments/ (the launcher's layout);
run records are kept in runs_dir(job)/runs.json so a restarted control plane still knows
them (a run that was active when the control plane died is reported failed, with that
reason: resume it). Stopping a run asks the trainer to checkpoint and exit (code 75).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fm_pipeline.api import progress
from fm_pipeline.api.orchestrator import RunInfo, ThreadedRuns
from fm_pipeline.config import JobSpec
from fm_pipeline.config.paths import runs_dir, store_uri
from fm_pipeline.storage import open_store

log = logging.getLogger(__name__)
RUNS_FILE = "runs.json"
TRAINER_MODULE = "fm_pipeline.train"


@dataclass
class _Active:
    info: RunInfo
    thread: threading.Thread | None = None
    stop_as: str | None = None  # "preempted" or "cancelled" once a stop was asked
    segment_dir: Path | None = None


class LocalOrchestrator(ThreadedRuns):
    # SegmentLaunch has no --resume-from yet: runs restore the newest valid checkpoint.
    supports_resume_from = False

    def __init__(self, *, trainer_module: str = TRAINER_MODULE):
        self.trainer_module = trainer_module
        self._lock = threading.Lock()
        self._active: dict[str, _Active] = {}

    # -- Orchestrator ------------------------------------------------------------------

    def submit(self, job: JobSpec) -> str:
        return self._start(job, resumed_from=None)

    def resume(self, job: JobSpec, *, checkpoint: str | None = None) -> str:
        if checkpoint is not None:
            raise ValueError("the local orchestrator resumes from the newest valid checkpoint only")
        return self._start(job, resumed_from="latest valid")

    def status(self, job_name: str) -> list[RunInfo]:
        runs = self._load(job_name)
        with self._lock:
            active = self._active.get(job_name)
            if runs and runs[-1].state in ("starting", "running") and (
                    active is None or active.info.run_id != runs[-1].run_id):
                runs[-1] = replace(runs[-1], state="failed", ended_at=runs[-1].started_at,
                                   reason="the control plane stopped while this run was active")
            elif active is not None and runs and active.info.run_id == runs[-1].run_id:
                runs[-1] = active.info
        return runs

    def preempt(self, job_name: str) -> None:
        self._stop(job_name, "preempted")

    def cancel(self, job_name: str) -> None:
        self._stop(job_name, "cancelled")

    def list(self) -> list[str]:
        root = runs_dir("x").parent
        return sorted(p.parent.name for p in root.glob(f"*/{RUNS_FILE}"))

    # -- internals ---------------------------------------------------------------------

    def _start(self, job: JobSpec, *, resumed_from: str | None) -> str:
        with self._lock:
            current = self._active.get(job.name)
            # A recorded end is enough (its thread may still be returning): a requeued job
            # can start again at once.
            if current is not None and not current.info.ended:
                raise ValueError(f"job {job.name} already has an active run {current.info.run_id}")
            info = RunInfo(run_id="run-" + secrets.token_hex(4), state="running",
                           started_at=time.time(), resumed_from=resumed_from)
            active = _Active(info)
            self._active[job.name] = active
            self._save(job.name, info)
            active.thread = threading.Thread(target=self._run, args=(job, active), daemon=True,
                                             name=f"run-{job.name}")
            active.thread.start()
        return info.run_id

    def _run(self, job: JobSpec, active: _Active) -> None:
        from fm_pipeline.launch import SegmentLaunch, run_segment_locally
        from fm_pipeline.launch.local import new_segment_dir

        target, every = job.training.steps, job.training.segment_steps
        step = self._committed_step(job.name)
        state, reason = "succeeded", f"reached the target step {target}"
        try:
            while step < target:
                if active.stop_as:
                    state, reason = active.stop_as, f"{active.stop_as} before segment start"
                    break
                end = min(target, (step // every + 1) * every)
                launch = SegmentLaunch(job, end_step=end, module=self.trainer_module)
                active.segment_dir = new_segment_dir(launch)
                if active.stop_as:  # asked between the check and the directory
                    self._flag(job.name, active)
                result = run_segment_locally(launch, segment_dir=active.segment_dir, echo=None)
                if result.outcome.value == "succeeded":
                    step = end
                    continue
                if result.outcome.value == "preempted":
                    state = active.stop_as or "preempted"
                    reason = f"{state} at a checkpoint: {result.reason}"
                else:
                    state, reason = "failed", f"{result.outcome.value}: {result.reason}"
                break
        except Exception as e:  # the launcher itself failed: the run ends with the reason
            state, reason = "failed", f"launch failed: {e}"
            log.warning("run of %s failed to launch: %s", job.name, e)
        with self._lock:
            active.info = replace(active.info, state=state, ended_at=time.time(), reason=reason)
            self._save(job.name, active.info)

    def _stop(self, job_name: str, how: str) -> None:
        with self._lock:
            active = self._active.get(job_name)
            if active is None or active.info.ended or active.stop_as:
                return
            active.stop_as = how
            self._flag(job_name, active)
        # The trainer ignores a flag older than its own start (a leftover): keep touching it
        # until the run ends, so a stop sent while torchrun starts up is not lost.
        threading.Thread(target=self._keep_flagging, args=(job_name, active), daemon=True).start()

    def _keep_flagging(self, job_name: str, active: _Active, every_s: float = 2.0) -> None:
        while active.thread is not None and active.thread.is_alive():
            time.sleep(every_s)
            with self._lock:
                if not active.info.ended:
                    self._flag(job_name, active)

    def _flag(self, job_name: str, active: _Active) -> None:
        """Touch the segment's preemption flag (the launcher points FM_PREEMPT_FILE at it):
        the trainer checkpoints at the next step boundary and exits 75."""
        if active.segment_dir is not None:
            (active.segment_dir / "preempt").touch()

    def _committed_step(self, job_name: str) -> int:
        last = progress.last_committed(progress.checkpoints(job_name, open_store(store_uri())))
        return last.step if last else 0

    def _load(self, job_name: str) -> list[RunInfo]:
        path = runs_dir(job_name) / RUNS_FILE
        if not path.is_file():
            return []
        return [RunInfo(**r) for r in json.loads(path.read_text(encoding="utf-8"))]

    def _save(self, job_name: str, info: RunInfo) -> None:
        runs = [r for r in self._load(job_name) if r.run_id != info.run_id] + [info]
        path = runs_dir(job_name) / RUNS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in runs], indent=1), encoding="utf-8")
        tmp.replace(path)
