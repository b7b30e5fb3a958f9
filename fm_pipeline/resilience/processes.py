"""A local training segment running in the background, so that faults can be injected into
it while it trains: find its workers, signal them, wait for a step.

    live = LiveSegment(SegmentLaunch(job, end_step=8), site=site).start()
    live.wait_for_step(3)                    # rank 0 logged step 3 (metrics.jsonl)
    live.signal_rank(1, signal.SIGKILL)      # the worker process of global rank 1
    result = live.result()                   # fm_pipeline.launch.SegmentResult

Workers are found through a marker in their environment (FM_CHAOS_MARKER, unique per
segment, inherited from torchrun by every worker), read from /proc/<pid>/environ: the
launcher keeps its process handles to itself, and the same lookup works for processes
started by anyone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

from fm_pipeline.config.site import Site
from fm_pipeline.launch.outcome import SegmentResult
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.rundir.events import append_event
from fm_pipeline.rundir.records import METRICS_FILE, read_records

MARKER_ENV = "FM_CHAOS_MARKER"
TRAINER_MODULE = b"fm_pipeline.train"


class SegmentGone(RuntimeError):
    """The segment ended (or never got there) before what we were waiting for."""


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours
        return {}
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def marked_processes(marker: str) -> list[tuple[int, dict[bytes, bytes]]]:
    """(pid, environment) of every live process carrying FM_CHAOS_MARKER=marker."""
    want = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = _environ(int(entry.name))
        if env.get(MARKER_ENV.encode()) == want:
            found.append((int(entry.name), env))
    return found


def trainer_workers(marker: str) -> dict[int, int]:
    """Global rank -> pid of the trainer workers carrying the marker."""
    workers = {}
    for pid, env in marked_processes(marker):
        if b"RANK" in env and TRAINER_MODULE in _cmdline(pid):
            workers[int(env[b"RANK"])] = pid
    return workers


def step_records(runs: Path, *, since: float) -> list[dict]:
    """Step records rank 0 wrote at or after unix time `since`."""
    return [r for r in read_records(Path(runs) / METRICS_FILE, "step")
            if r.get("time", 0) >= since]


def wait_for_step(steps, step: int, *, alive, timeout_s: float, what) -> dict:
    """Poll `steps()` (step records) for `step` or a later one; SegmentGone once `alive()`
    is false first, or after `timeout_s`. `what()` describes the run for the error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = [r for r in steps() if r["step"] >= step]
        if done:
            return done[0]
        if not alive():
            raise SegmentGone(f"{what()} ended before step {step}")
        time.sleep(0.05)
    raise SegmentGone(f"{what()} did not reach step {step} within {timeout_s:.0f} s")


def wait_for_checkpoint(job_runs_dir: Path, step: int, *, timeout_s: float,
                        alive=lambda: True) -> Path:
    """Poll for runs_dir/checkpoints/step-XXXXXXXX/manifest.json (written last)."""
    path = job_runs_dir / "checkpoints" / f"step-{step:08d}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (path / "manifest.json").is_file():
            return path
        if not alive():
            raise SegmentGone(f"segment ended before checkpoint {step} was committed")
        time.sleep(0.05)
    raise SegmentGone(f"checkpoint {step} not committed within {timeout_s:.0f} s")


class LiveSegment:
    def __init__(self, launch: SegmentLaunch, *, site: Site, env: dict[str, str] | None = None,
                 timeout_s: float | None = 600):
        self.launch, self.site = launch, site
        self.runs = site.runs_dir(launch.job.name)
        self.marker = uuid.uuid4().hex
        self.env = {**(env or {}), MARKER_ENV: self.marker}
        self.timeout_s = timeout_s
        self.started_at: float | None = None  # unix time
        self.ended_at: float | None = None
        self._preempt = threading.Event()
        self._result: SegmentResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"segment-{launch.rdzv_id}",
                                        daemon=True)

    def start(self) -> LiveSegment:
        self.started_at = time.time()
        self._thread.start()
        return self

    def _run(self) -> None:
        from fm_pipeline.launch.local import run_segment_locally

        try:
            self._result = run_segment_locally(self.launch, site=self.site, env=self.env,
                                               echo=None,
                                               timeout_s=self.timeout_s, preempt=self._preempt)
        except BaseException as e:  # handed to result()
            self._error = e
        finally:
            self.ended_at = time.time()
            code = self._result.exit_code if self._result is not None else None
            append_event(self.runs, "segment_ended", exit_code=code,
                         started_at=self.started_at)  # a record the fault figures read

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def steps(self) -> list[dict]:
        return step_records(self.runs, since=self.started_at or 0.0)

    def wait_for_step(self, step: int, *, timeout_s: float = 300) -> dict:
        """The step record of `step` (or later) once rank 0 logged it."""
        return wait_for_step(self.steps, step, alive=lambda: self.running, timeout_s=timeout_s,
                             what=lambda: f"segment to step {self.launch.end_step} "
                                          f"({self._describe()})")

    def wait_for_checkpoint(self, step: int, *, timeout_s: float = 300) -> Path:
        """The checkpoint of `step`, once committed (its manifest exists)."""
        return wait_for_checkpoint(self.runs, step, timeout_s=timeout_s,
                                   alive=lambda: self.running)

    def workers(self, *, expect: int | None = None, timeout_s: float = 30) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        expect = expect or self.launch.job.parallelism.world_size
        while True:
            found = trainer_workers(self.marker)
            if len(found) >= expect or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def signal_rank(self, rank: int, sig: int) -> int:
        """Send `sig` to the worker process of global `rank`; returns its pid."""
        pid = self.workers().get(rank)
        if pid is None:
            raise SegmentGone(f"no live worker process for rank {rank}")
        os.kill(pid, sig)
        return pid

    def preempt(self) -> None:
        """SIGTERM to torchrun, as a preempting scheduler does (it forwards to the workers)."""
        self._preempt.set()

    def result(self, *, timeout_s: float = 600) -> SegmentResult:
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            raise SegmentGone(f"segment still running after {timeout_s:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cleanup(self) -> None:
        """SIGKILL whatever of this segment is still alive (a stopped rank too)."""
        for pid, _ in marked_processes(self.marker):
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break

    def _describe(self) -> str:
        if self._thread.is_alive():
            return "running"
        if self._error is not None:
            return f"launcher error {self._error!r}"
        r = self._result
        return f"{r.outcome.value} (exit {r.exit_code}): {r.reason}" if r else "no result"
