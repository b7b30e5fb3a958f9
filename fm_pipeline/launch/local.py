"""Run one training segment on this machine: the torchrun command, its output and its outcome.

    from fm_pipeline.launch import SegmentLaunch, run_segment_locally
    result = run_segment_locally(SegmentLaunch(job, end_step=20), site=site)
    result.outcome, result.exit_code, result.reason      # succeeded / preempted / failed ...

No Dagster here: the CLI, chaos tests and the API call this; the Dagster resource
(fm_pipeline.resources.launcher_local) calls it inside a Pipes session. Everything a
segment leaves is under site.runs_dir(job)/segments/<end_step>-<time>/: job.yaml, torchrun.log
(torchrun's and the workers' output), torchrun/ (per-worker error files), error.json,
result.json. Touching `preempt` there (preempt_running_segments) asks the trainer to
checkpoint and exit (75).
Interrupting the caller (Ctrl-C, a Dagster run terminated from the UI or the API) sends
torchrun SIGTERM, which it forwards to the workers: they checkpoint and exit 75; result.json
is written and the exception carries the result (`e.segment_result`), so the caller can
record what the segment did before it re-raises. Should the caller die outright (SIGKILL),
torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG): the segment stops at a checkpoint
rather than training on with nobody to follow it. Every process the segment starts carries
its tag (launch/reaper.py): what is left once torchrun exits is ended, and the next launch
on this machine ends what a dead launcher left.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from fm_pipeline.config.site import Site
from fm_pipeline.launch.capacity import LocalCapacity, local_fit_problems
from fm_pipeline.launch.outcome import (
    Outcome,
    SegmentResult,
    diagnose,
    outcome_of,
    worker_error_files,
)
from fm_pipeline.launch.reaper import end_tagged, reap_orphans, tag_segment
from fm_pipeline.launch.spec import SegmentLaunch, SegmentPaths, local_paths
from fm_pipeline.rundir import exit_codes
from fm_pipeline.rundir.torchrun import torchrun_executable

# After SIGTERM, torchrun waits its --shutdown-timeout for the workers; then this much more.
STOP_MARGIN_S = 10
# What a process left behind after torchrun exited gets between SIGTERM and SIGKILL.
ORPHAN_GRACE_S = 2.0


def new_segment_dir(launch: SegmentLaunch, site: Site) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    path = site.runs_dir(launch.job.name) / "segments" / f"{launch.end_step:08d}-{stamp}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def segment_command(launch: SegmentLaunch, site: Site,
                    segment_dir: Path | None = None) -> tuple[list[str], SegmentPaths]:
    """Create the segment directory with its job.yaml; return (argv, paths)."""
    segment_dir = segment_dir or new_segment_dir(launch, site)
    segment_dir.mkdir(parents=True, exist_ok=True)
    paths = local_paths(segment_dir)
    paths.job_file.write_text(launch.job_yaml(), encoding="utf-8")
    argv = launch.torchrun_argv(launch.standalone(), paths=paths)
    return torchrun_executable() + argv[1:], paths


def run_segment_locally(
    launch: SegmentLaunch,
    *,
    site: Site,
    env: dict[str, str] | None = None,
    segment_dir: Path | None = None,
    echo: TextIO | None = sys.stdout,
    timeout_s: float | None = None,
    preempt: threading.Event | None = None,
) -> SegmentResult:
    """Run the segment to completion and say what happened; never raises for a failed run
    (call `result.raise_for_outcome()` for that). `env` is added to the workers' environment
    (e.g. Dagster Pipes bootstrap variables) after `site`'s, where the workers' entry point
    finds the same state (store, runs, tracking); `echo` receives the live output (None: quiet).
    Setting `preempt` sends torchrun SIGTERM, as a preempting scheduler would: the ranks
    checkpoint and the result says "preempted". A job this machine cannot hold (more ranks
    than its GPUs or cores allow, more memory than it has) starts no process: the result
    says bad_config and why (launch.capacity)."""
    refused = local_fit_problems(launch.job, LocalCapacity.of_this_machine())
    if refused:
        return _refused(launch, refused, segment_dir or new_segment_dir(launch, site))
    reap_orphans()  # what a crashed launcher left must not hold cores or the job's files
    argv, paths = segment_command(launch, site, segment_dir)
    segment_dir = paths.job_file.parent
    output_log = segment_dir / "torchrun.log"
    tag, tag_env = tag_segment()
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **site.env(), **paths.env(), **(env or {}),
                **tag_env}
    started = time.monotonic()
    timed_out = False
    with open(output_log, "wb") as log:
        # Own session: a Ctrl-C in the terminal reaches us, and we decide what torchrun gets.
        proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=stop_with_parent)
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, echo), daemon=True)
        pump.start()
        try:
            timed_out = _wait(proc, timeout_s=timeout_s, preempt=preempt)
            if timed_out or proc.poll() is None:
                stop(proc, grace_s=launch.shutdown_timeout_s + STOP_MARGIN_S)
        except BaseException as e:  # interrupted: the segment stops at a checkpoint first
            stop(proc, grace_s=launch.shutdown_timeout_s + STOP_MARGIN_S)
            pump.join(timeout=10)
            e.segment_result = _finish(launch, paths, proc, output_log, started, tag,
                                       timed_out=False, timeout_s=timeout_s)
            raise
        finally:
            pump.join(timeout=10)
    return _finish(launch, paths, proc, output_log, started, tag, timed_out=timed_out,
                   timeout_s=timeout_s)


def _finish(launch, paths, proc, output_log: Path, started: float, tag: str, *,
            timed_out: bool, timeout_s: float | None) -> SegmentResult:
    # torchrun is gone: whatever still carries the segment's tag (a worker's helper in a
    # session of its own, a worker torchrun lost track of) is an orphan.
    if leftovers := end_tagged(tag, grace_s=ORPHAN_GRACE_S):
        with open(output_log, "ab") as log:
            log.write(f"[fm launcher] ended {len(leftovers)} process(es) left after torchrun "
                      f"exited: {', '.join(map(str, leftovers))}\n".encode())
    result = _result(launch, paths, proc.returncode, output_log,
                     time.monotonic() - started, timed_out=timed_out, timeout_s=timeout_s)
    (paths.job_file.parent / "result.json").write_text(json.dumps(result.to_dict(), indent=2))
    return result


def _refused(launch: SegmentLaunch, problems: list[tuple[str, str]],
             segment_dir: Path) -> SegmentResult:
    segment_dir.mkdir(parents=True, exist_ok=True)
    reason = "not started: the job does not fit the local launcher: " + "; ".join(
        f"{field}: {msg}" for field, msg in problems)
    result = SegmentResult(job=launch.job.name, end_step=launch.end_step,
                           outcome=Outcome.BAD_CONFIG, exit_code=exit_codes.BAD_CONFIG,
                           reason=reason, torchrun_exit_code=exit_codes.BAD_CONFIG,
                           duration_s=0.0, evidence="launch.capacity",
                           segment_dir=str(segment_dir))
    (segment_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2))
    return result


_PR_SET_PDEATHSIG = 1


def stop_with_parent() -> None:  # in the child, between fork and exec
    """SIGTERM torchrun when the process that launched it dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux: the caller's own cleanup must do
        pass


def _wait(proc: subprocess.Popen, *, timeout_s: float | None,
          preempt: threading.Event | None) -> bool:
    """Until torchrun exits (False), the time limit passes (True), or `preempt` is set."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            proc.wait(timeout=0.2)
            return False
        except subprocess.TimeoutExpired:
            pass
        if preempt is not None and preempt.is_set():
            return False
        if deadline is not None and time.monotonic() > deadline:
            return True


def stop(proc: subprocess.Popen, *, grace_s: float) -> None:
    """SIGTERM torchrun (it forwards to the workers, who checkpoint); after `grace_s`, SIGKILL
    torchrun and every process under it (workers run in sessions of their own, so killing
    torchrun's group alone would leave them running)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        tree = descendants(proc.pid)
        for pid in [proc.pid, *tree]:
            try:
                if pid == os.getpgid(pid):  # a group leader: its helpers go with it
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()


def running_segment_dirs(runs: Path) -> list[Path]:
    """The segment directories under the job's run directory `runs` whose torchrun has not
    finished (no result.json yet)."""
    root = Path(runs) / "segments"
    if not root.is_dir():
        return []
    return [d for d in root.iterdir() if d.is_dir() and (d / "job.yaml").is_file()
            and not (d / "result.json").exists()]


def preempt_running_segments(runs: Path) -> list[Path]:
    """Touch the preemption flag (the trainer's FM_PREEMPT_FILE) of every running segment of
    the job: each checkpoints at its next step boundary and exits 75. The trainer ignores a
    flag older than itself, so a caller that may be early touches it again until the end."""
    running = running_segment_dirs(runs)
    for segment_dir in running:
        local_paths(segment_dir).preempt_flag.touch()
    return running


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pump(stream, log, echo: TextIO | None) -> None:
    for line in iter(stream.readline, b""):
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(line.decode("utf-8", errors="replace"))
            echo.flush()
    stream.close()


def _result(launch: SegmentLaunch, paths: SegmentPaths, returncode: int, output_log: Path,
            duration_s: float, *, timed_out: bool, timeout_s: float | None) -> SegmentResult:
    common = dict(
        job=launch.job.name, end_step=launch.end_step, torchrun_exit_code=returncode,
        duration_s=round(duration_s, 3), segment_dir=str(paths.job_file.parent),
        output_log=str(output_log),
        error_files=tuple(str(p) for p in worker_error_files(paths.log_dir)),
    )
    if returncode == 0 and not timed_out:
        return SegmentResult(outcome=Outcome.SUCCEEDED, exit_code=0, reason="reached end step",
                             **common)
    text = output_log.read_text(encoding="utf-8", errors="replace")
    evidence = diagnose(log_dir=paths.log_dir, agent_error_file=paths.error_file,
                        output_text=text)
    exit_code = evidence.exit_code if evidence.exit_code is not None else returncode
    reason = evidence.reason or _no_record_reason(returncode, text)
    outcome = outcome_of(exit_code)
    if timed_out:
        outcome = Outcome.TIMED_OUT
        reason = f"stopped after the {timeout_s:g} s time limit; then: {reason}"
    return SegmentResult(outcome=outcome, exit_code=exit_code, reason=reason,
                         failed_rank=evidence.rank, traceback=evidence.traceback,
                         evidence=evidence.source, **common)


def _no_record_reason(returncode: int, output: str) -> str:
    tail = [line for line in output.strip().splitlines()[-5:] if line.strip()]
    last = tail[-1].strip() if tail else "(no output)"
    if returncode < 0:
        return f"torchrun was killed by signal {-returncode}; last output: {last}"
    return f"torchrun exited {returncode} and no worker left an error record; last output: {last}"
