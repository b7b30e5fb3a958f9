"""The orchestrator on one machine: a run is a thread that launches the job's torchrun
segments one after another (`fm_pipeline.launch.run_segment_locally`) until the job's
target step, a failure the retry policy stops on, or a stop. Each segment is planned,
checked and adjusted for stragglers by the functions the Dagster path calls
(orchestration.segments.prepare_segment: plan_segment, the data mix, the exclusions), and a
failure is resumed or not by its retry policy (orchestration.retry.decide_after_failure).
The Dagster orchestrator replaces it at scale; both answer the same `Orchestrator` interface.

Each segment leaves its evidence under site.runs_dir(job)/segments/ (the launcher's layout);
run records are kept in site.runs_dir(job)/runs.json so a restarted control plane still knows
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

from fm_pipeline.api.orchestrator import RunInfo, ThreadedRuns
from fm_pipeline.config import JobSpec
from fm_pipeline.config.site import Site
from fm_pipeline.orchestration.retry import RetryPolicy

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
    def __init__(self, *, site: Site, trainer_module: str = TRAINER_MODULE,
                 policy: RetryPolicy | None = None):
        self.site = site  # where the jobs' store and run directories are
        self.trainer_module = trainer_module
        self.policy = policy or RetryPolicy()  # the Dagster path's TrainingPolicyResource
        self._lock = threading.Lock()
        self._active: dict[str, _Active] = {}

    # -- Orchestrator ------------------------------------------------------------------

    def submit(self, job: JobSpec) -> str:
        return self._start(job, resumed_from=None)

    def resume(self, job: JobSpec, *, checkpoint: str | None = None) -> str:
        return self._start(job, resumed_from=checkpoint or "latest valid",
                           checkpoint=checkpoint or "")

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
        return sorted(p.parent.name for p in self.site.runs_root.glob(f"*/{RUNS_FILE}"))

    # -- internals ---------------------------------------------------------------------

    def _start(self, job: JobSpec, *, resumed_from: str | None, checkpoint: str = "") -> str:
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
            active.thread = threading.Thread(target=self._run, args=(job, active, checkpoint),
                                             daemon=True, name=f"run-{job.name}")
            active.thread.start()
        return info.run_id

    def _run(self, job: JobSpec, active: _Active, checkpoint: str) -> None:
        try:
            state, reason = self._segments(job, active, rollback_to=checkpoint)
        except Exception as e:  # the launcher itself failed: the run ends with the reason
            state, reason = "failed", f"launch failed: {e}"
            log.warning("run of %s failed to launch: %s", job.name, e)
        with self._lock:
            active.info = replace(active.info, state=state, ended_at=time.time(), reason=reason)
            self._save(job.name, active.info)

    def _segments(self, job: JobSpec, active: _Active, *, rollback_to: str) -> tuple[str, str]:
        """The job's segments in turn, on the decisions the Dagster path makes: each one's
        plan, data-mix check and straggler exclusions (orchestration.segments), its planted
        fault, and after a failure the retry policy's resume or stop (orchestration.retry).
        `rollback_to`: the checkpoint the first segment starts from ("": the newest valid)."""
        from fm_pipeline.launch import SegmentLaunch, run_segment_locally
        from fm_pipeline.launch.local import new_segment_dir
        from fm_pipeline.orchestration.registry import take_fault
        from fm_pipeline.orchestration.retry import decide_after_failure
        from fm_pipeline.orchestration.segments import SegmentNotRunnable, prepare_segment
        from fm_pipeline.train.faults import FAIL_AT_ENV

        store, attempts = self.site.store(), []
        while True:
            if active.stop_as:
                return active.stop_as, f"{active.stop_as} before segment start"
            try:
                segment = prepare_segment(job, store, site=self.site, resume_from=rollback_to,
                                          target="local")
            except SegmentNotRunnable as e:
                if e.metadata.get("start_step", -1) >= job.training.steps:
                    return "succeeded", f"reached the target step {job.training.steps}"
                return "failed", f"bad_config: {e}"
            launch = SegmentLaunch(segment.launch_job, end_step=segment.end,
                                   module=self.trainer_module, resume_from=segment.resume_from,
                                   planned=not segment.chosen)
            env = segment.launch_env
            if fault := take_fault(store, job.name, start=segment.start, end=segment.end):
                env[FAIL_AT_ENV] = fault
            active.segment_dir = new_segment_dir(launch, self.site)
            if active.stop_as:  # asked between the check and the directory
                self._flag(job.name, active)
            launched_at = time.time()
            result = run_segment_locally(launch, site=self.site, segment_dir=active.segment_dir,
                                         env=env, echo=None)
            rollback_to = ""  # rolled back once: from here on the newest valid again
            if result.ok:
                continue
            if result.outcome.value == "preempted":
                state = active.stop_as or "preempted"
                return state, f"{state} at a checkpoint: {result.reason}"
            failed = self._attempt(job, result, start=segment.start, since=launched_at,
                                   number=len(attempts))
            decision = decide_after_failure(failed, earlier=attempts, policy=self.policy)
            attempts.append(failed)
            if not decision.resume:
                return "failed", f"{result.outcome.value}: {result.reason} ({decision.reason})"
            log.info("run of %s: %s", job.name, decision.reason)
            while time.time() < decision.not_before and not active.stop_as:
                time.sleep(min(1.0, decision.not_before - time.time()))

    def _attempt(self, job: JobSpec, result, *, start: int, since: float, number: int):
        """The failed launch as the retry policy reads it (the Dagster path's attempt_of)."""
        from fm_pipeline.orchestration.retry import SegmentAttempt
        from fm_pipeline.rundir.records import METRICS_FILE, latest_record

        record = latest_record(self.site.runs_dir(job.name) / METRICS_FILE, "step")
        return SegmentAttempt(
            run_id=f"local-{number}", outcome=result.outcome.value, ended_at=time.time(),
            reason=result.reason, exit_code=result.exit_code,
            failed_at_step=record["step"] if record.get("time", 0) >= since else None,
            start_step=start, end_step=result.end_step, wall_s=result.duration_s)

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

    def _load(self, job_name: str) -> list[RunInfo]:
        path = self.site.runs_dir(job_name) / RUNS_FILE
        if not path.is_file():
            return []
        return [RunInfo(**r) for r in json.loads(path.read_text(encoding="utf-8"))]

    def _save(self, job_name: str, info: RunInfo) -> None:
        runs = [r for r in self._load(job_name) if r.run_id != info.run_id] + [info]
        path = self.site.runs_dir(job_name) / RUNS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in runs], indent=1), encoding="utf-8")
        tmp.replace(path)
