"""Operational faults: the control plane and its clocks, not the training processes.

- `api-kill-submit`: `fm api serve` SIGKILLed after the run was submitted to Dagster, before
  its queue row says so (a fail point, fm_pipeline/failpoints.py); the client's request
  gets no answer. The operator restarts the server; the client retries with its
  Idempotency-Key. A second job waits for the GPUs meanwhile.
- `daemon-kill`: the instance's dagster-daemon SIGKILLed while a segment trains.
- `clock-skew`: a trainer on another host whose wall clock runs 120 s ahead (libfaketime)
  starts on a job whose live trainer holds the lease.

The first two run the real deployment `fm api serve` keeps: sqlite instance, its daemon
(sensors, run queue, run monitoring), torchrun segments of the debug model.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import yaml

from fm_pipeline.resilience.api_server import ApiServer, group_members
from fm_pipeline.resilience.injectors import Unavailable
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.processes import LiveSegment, step_records
from fm_pipeline.resilience.scenarios.common import first_line
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event
from fm_pipeline.rundir.records import SEGMENTS_FILE, read_records
from fm_pipeline.rundir.torchrun import torchrun_executable

POOL_GPUS = 2
TENANTS = {"pool": {"gpu": POOL_GPUS}, "launcher": "local", "tenants": [
    {"name": "prod", "weight": 1, "quota": {"gpu": POOL_GPUS}, "priorities": ["normal"]}]}
ACTIVE = ("running", "preempting", "cancelling")
ENDED = ("succeeded", "failed", "cancelled")
STEPS = 8


class Client:
    """A tenant calling the REST API with its own token."""

    def __init__(self, base: str, tenant: str, site):
        from fm_pipeline.api.auth import TokenStore, tokens_path

        self.base = base  # the server's site: where its tokens are
        token = TokenStore(tokens_path(site)).issue(tenant=tenant)[1]
        self.headers = {"Authorization": f"Bearer {token}"}

    def submit(self, body: dict, *, key: str | None = None) -> httpx.Response:
        headers = {**self.headers, **({"Idempotency-Key": key} if key else {})}
        return httpx.post(f"{self.base}/v1/training/jobs", json=body, headers=headers,
                          timeout=120)

    def get(self, path: str) -> dict:
        r = httpx.get(f"{self.base}/v1/training/jobs{path}", headers=self.headers, timeout=60)
        r.raise_for_status()
        return r.json()

    def status(self, job_id: str) -> dict:
        return self.get(f"/{job_id}")


def _body(ws: ChaosWorkspace, *, gpus: int, steps: int = STEPS) -> dict:
    from fm_pipeline.data import mix_key

    job = ws.job("chaos-api-mix")  # the small mix the API jobs read
    ws.prepare(job)
    return {"model": "debug", "gpus": gpus, "parallelism": {"tp": 1, "pp": 1, "dp": gpus},
            "checkpoint_every_steps": 2, "steps": steps, "priority": "normal",
            "data_manifest": str(ws.store_dir / "data" / mix_key(job) / "manifest.json")}


def _env(ws: ChaosWorkspace, **extra: str) -> dict[str, str]:
    # Zero retry backoff, as in every scenario: production adds it to the time to resume.
    return {"FM_STORE_URI": str(ws.store_dir), "FM_RETRY_BACKOFF_S": "0",
            "FM_LAUNCHER_ECHO": "0", "OMP_NUM_THREADS": "1", **extra}


def _wait(what: str, predicate, *, timeout_s: float, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        if (value := predicate()):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def _steps(ws: ChaosWorkspace, job_id: str) -> list[dict]:
    return step_records(ws.site.runs_dir(job_id), since=0.0)


def _segments(ws: ChaosWorkspace, job_id: str) -> list[dict]:
    return read_records(ws.site.runs_dir(job_id) / SEGMENTS_FILE, "segment")


def api_kill_submit(ws: ChaosWorkspace) -> FaultResult:
    result = FaultResult("api-kill-submit", expected=(
        "the restarted server adopts the run the daemon started (admitted, not launch_failed, "
        "not launched again); the client's retry with its Idempotency-Key gets the same job; "
        "a second job waits: GPUs in active runs never exceed the pool; 0 steps lost"))
    api = ApiServer(ws.home, TENANTS, env=_env(ws), name="api-kill-submit")
    with api:
        api.start(env={"FM_FAILPOINTS": "api.after_run_submitted=kill"})
        prod = Client(api.base, "prod", ws.site)
        key = f"chaos-{uuid.uuid4().hex[:12]}"
        body = _body(ws, gpus=POOL_GPUS)
        killed_at = time.time()
        try:
            answer = f"answered {prod.submit(body, key=key).status_code}"
        except httpx.TransportError as e:
            answer = f"no answer ({type(e).__name__})"
        code = api.wait_exit(30)
        result.injected = ("fail point api.after_run_submitted: `fm api serve` SIGKILLed after "
                           "the run was submitted, before the queue row said so")
        api.start()  # the operator restarts it: no fail point now
        retry = prod.submit(body, key=key)
        job_id = retry.json().get("job_id", "?") if retry.status_code in (200, 201) else "?"
        append_event(ws.site.runs_dir(job_id), "fault_injected", fault=result.fault, target=result.injected,
                     time=round(killed_at, 3), detect=False)
        jobs = prod.get("")["jobs"]  # before the second job: the retry made none
        other = prod.submit(_body(ws, gpus=1, steps=2)).json().get("job_id", "?")
        most, seen = 0, set()

        def both_ended() -> bool:
            nonlocal most
            states = {j: prod.status(j)["status"] for j in (job_id, other)}
            held = {job_id: POOL_GPUS, other: 1}
            most = max(most, sum(held[j] for j, s in states.items() if s in ACTIVE))
            seen.update(f"{'first' if j == job_id else 'other'}:{s}" for j, s in states.items())
            return all(s in ENDED for s in states.values())

        _wait("both jobs to end", both_ended, timeout_s=600, every_s=0.3)
        status, events = prod.status(job_id), prod.get(f"/{job_id}/events")["events"]
    admitted = [e for e in events if e["kind"] == "admitted"]
    kinds = [e["kind"] for e in events]
    result.record_figures(ws.site.runs_dir(job_id))
    result.outcome = (f"submit: {answer}, server exit {code}; retry {retry.status_code} "
                      f"(replayed: {retry.headers.get('Idempotent-Replayed')}); {job_id} "
                      f"{status['status']} at step {status['step']} in {status['runs']} run(s); "
                      f"at most {most} of {POOL_GPUS} GPUs in active runs")
    result.check(f"the submitting request got no answer and the server died by SIGKILL "
                 f"({answer}, exit {code})", answer.startswith("no answer") and code == -9)
    result.check(f"the retry with the same Idempotency-Key got the same job back, replayed "
                 f"({retry.status_code}, {retry.headers.get('Idempotent-Replayed')}), and "
                 f"the tenant has one job ({len(jobs)})",
                 retry.status_code in (200, 201) and
                 retry.headers.get("Idempotent-Replayed") == "true" and len(jobs) == 1)
    result.check(f"the restarted control plane adopted the daemon's run: "
                 f"{[e['detail'].get('adopted') for e in admitted]}; no launch_failed",
                 len(admitted) == 1 and admitted[0]["detail"].get("adopted")
                 and "launch_failed" not in kinds)
    result.check(f"one run, one segment ({status['runs']} run(s), "
                 f"{len(_segments(ws, job_id))} segment record(s))",
                 status["runs"] == 1 and len(_segments(ws, job_id)) == 1)
    result.check(f"GPUs in active runs never exceeded the pool: at most {most} of "
                 f"{POOL_GPUS} (statuses seen: {sorted(seen)})",
                 0 < most <= POOL_GPUS and "other:queued" in seen)
    result.check(f"the job succeeded at step {STEPS} (status {status['status']}, step "
                 f"{status['step']}) and the waiting one after it",
                 status["status"] == "succeeded" and status["step"] == STEPS
                 and "other:succeeded" in seen)
    result.check(f"0 steps lost ({result.steps_lost})", result.steps_lost == 0)
    return result


def daemon_kill(ws: ChaosWorkspace) -> FaultResult:
    result = FaultResult("daemon-kill", expected=(
        "the segment trains on (its run worker is not the daemon's to take down) and "
        "completes in its one run: 0 steps lost; `fm api serve` starts another daemon "
        "within its keeper's 5 s; the API answers throughout; the killed daemon's code "
        "server ends by itself"))
    slow = {"FM_FAULT_SLOW_RANKS": "0:0.5"}  # time to act while the segment trains
    api = ApiServer(ws.home, TENANTS, env=_env(ws, **slow), name="daemon-kill")
    with api:
        api.start()
        prod = Client(api.base, "prod", ws.site)
        r = prod.submit(_body(ws, gpus=POOL_GPUS, steps=12))
        job_id = r.json()["job_id"]
        _wait("step 3 and checkpoint 2", lambda: any(s["step"] >= 3 for s in _steps(ws, job_id))
              and (ws.site.runs_dir(job_id) / "checkpoints" / "step-00000002" / "manifest.json"
                   ).is_file(), timeout_s=300, every_s=0.1)
        pid = api.daemon_pid()
        if pid is None:
            raise RuntimeError("no dagster-daemon holds the instance's lock")
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        step = max(s["step"] for s in _steps(ws, job_id))
        result.injected = f"SIGKILL to dagster-daemon (pid {pid}) at step {step}"
        append_event(ws.site.runs_dir(job_id), "fault_injected", fault=result.fault, target=result.injected,
                     step=step, time=round(killed_at, 3), detect=False)
        answered = []

        def back() -> int | None:
            answered.append(api.healthy())
            now = api.daemon_pid()
            return now if now not in (None, pid) else None

        new_pid = _wait("another daemon", back, timeout_s=180)
        daemon_back_s = time.time() - killed_at
        _wait("the job to end", lambda: prod.status(job_id)["status"] in ENDED,
              timeout_s=600, every_s=0.5)
        status = prod.status(job_id)
        # The killed daemon's children (its code server) are on their own: they must end.
        t0 = time.monotonic()
        try:
            _wait("the killed daemon's processes to end", lambda: not group_members(pid),
                  timeout_s=60)
        except TimeoutError:
            pass
        left, left_after_s = group_members(pid), time.monotonic() - t0
        _end_group(pid)
    segments = _segments(ws, job_id)
    result.record_figures(ws.site.runs_dir(job_id))
    overlap = _overlapping(_steps(ws, job_id))
    result.outcome = (f"another daemon (pid {new_pid}) after {daemon_back_s:.1f} s; {job_id} "
                      f"{status['status']} at step {status['step']} in {status['runs']} run(s), "
                      f"{len(segments)} segment(s): "
                      + ", ".join(f"{s.get('exit_reason')} {s.get('start_step')}->"
                                  f"{s.get('end_step')}" for s in segments))
    result.check(f"`fm api serve` started another daemon ({daemon_back_s:.1f} s; its keeper "
                 "looks every 5 s, a start takes seconds)", new_pid is not None and daemon_back_s < 5 + 30)
    result.check(f"the API answered /healthz throughout ({sum(answered)}/{len(answered)})",
                 all(answered))
    result.check(f"the job succeeded at step 12 ({status['status']}, step {status['step']})",
                 status["status"] == "succeeded" and status["step"] == 12)
    result.check(f"nothing of the killed daemon outlived it: its process group emptied by "
                 f"itself ({len(left)} left {left_after_s:.0f} s after the job ended; its code "
                 "server stops 20 s after the daemon's last heartbeat)", not left)
    result.check(f"one live segment at a time: no two segments' spans overlap ({overlap})",
                 not overlap)
    result.check(f"the segment rode through: one run, one segment ({status['runs']} run(s), "
                 f"{len(segments)} segment record(s)), 0 steps lost ({result.steps_lost})",
                 status["runs"] == 1 and len(segments) == 1 and result.steps_lost == 0)
    return result


def _end_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _overlapping(steps: list[dict]) -> list[str]:
    """Launches (metrics.jsonl's segment ids) whose step records interleave in time: two
    trainers at once. A killed launch writes no segment record, but its steps are here."""
    spans: dict[str, list[float]] = {}
    for r in steps:
        span = spans.setdefault(r.get("segment", "?"), [r["time"], r["time"]])
        span[0], span[1] = min(span[0], r["time"]), max(span[1], r["time"])
    ordered = sorted((a, b, seg) for seg, (a, b) in spans.items())
    return [f"{x[2]} and {y[2]}" for x, y in zip(ordered, ordered[1:]) if y[0] < x[1]]


FAKETIME_LIBS = "/usr/lib/*/faketime/libfaketime.so.1"
SKEW_S = 120


def clock_skew(ws: ChaosWorkspace) -> FaultResult:
    from fm_pipeline.config import dump_job
    from fm_pipeline.launch.spec import SegmentLaunch

    libs = sorted(glob.glob(FAKETIME_LIBS))
    if not libs:
        raise Unavailable("libfaketime is not installed (Debian package faketime)")
    ttl = 6.0
    job = ws.job("chaos-clock-skew", **{"training.steps": 16, "training.segment_steps": 16,
                                        "resilience.lease_ttl_s": ttl})
    result = FaultResult("clock-skew", expected=(
        f"the contender watches the holder renew (every {ttl / 3:g} s) and exits 3 naming "
        f"it, within one renewal; the holder trains every step once and completes: 0 steps "
        "lost"))
    ws.prepare(job)
    job_file = ws.home / "node-b" / "job.yaml"
    job_file.parent.mkdir(parents=True, exist_ok=True)
    job_file.write_text(yaml.safe_dump(dump_job(job)), encoding="utf-8")
    # The holder must still be training when the contender's rank 0 reaches the lease, after
    # its own start-up (torchrun, torch's imports: ~10 s on 2 busy cores): 15 steps of 1 s
    # after the first. At 0.5 s a step CI's contender once came up after the holder had
    # finished, took the released lease and found nothing left to train (exit 0).
    holder_run = LiveSegment(SegmentLaunch(job, end_step=job.training.steps), site=ws.site,
                             env={"FM_FAULT_SLOW_RANKS": "0:1.0,1:1.0"}).start()
    try:
        holder_run.wait_for_step(1)
        holder = json.loads((ws.site.runs_dir(job.name) / "lease.json").read_text())
        step = holder_run.steps()[-1]["step"]
        result.injected = (f"a trainer on host node-b (UTS namespace, its own disk, the same "
                           f"store) whose wall clock runs {SKEW_S} s ahead (libfaketime) "
                           f"started on {job.name} at step {step}")
        append_event(ws.site.runs_dir(job.name), "fault_injected", fault=result.fault, target=result.injected,
                     step=step, detect=False)
        t0 = time.monotonic()
        contender = _skewed_trainer(job_file, ws, libs[0], nproc=2)
        refused_s = time.monotonic() - t0
        done = holder_run.result()
    finally:
        holder_run.cleanup()
    text = contender.stdout + contender.stderr
    steps = [r["step"] for r in _steps(ws, job.name)]
    lease_lines = [ln for ln in text.splitlines() if "already being trained" in ln]
    result.record_figures(ws.site.runs_dir(job.name))
    result.outcome = (f"contender exit {contender.returncode} after {refused_s:.1f} s: "
                      f"{first_line(lease_lines[0] if lease_lines else text[-300:], 140)}; "
                      f"holder {done.outcome.value} at step {done.end_step}")
    result.check("the contender's rank 0 exits 3 (lease held) naming the holder's id and pid",
                 ("exitcode  : 3" in text or "exitcode : 3" in text) and
                 holder["holder"] in text and f"pid {holder['pid']}" in text)
    result.check(f"the skew was in force: by the contender's clock the holder's last heartbeat "
                 f"was {_heartbeat_ages(text)} s old, past its TTL ({ttl:g} s), and it still "
                 "did not take over", any(age >= SKEW_S / 2 for age in _heartbeat_ages(text)))
    result.check(f"the holder completes (at step {done.end_step})", done.ok)
    result.check(f"every step 1..{job.training.steps} trained once by the holder "
                 f"(metrics.jsonl: {len(steps)} records)",
                 steps == list(range(1, job.training.steps + 1)))
    result.check(f"0 steps lost ({result.steps_lost})", result.steps_lost == 0)
    return result


def _heartbeat_ages(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"heartbeat (-?\d+(?:\.\d+)?) s ago", text)]


def _skewed_trainer(job_file: Path, ws: ChaosWorkspace, lib: str, *,
                    nproc: int) -> subprocess.CompletedProcess:
    """torchrun on "node-b": its own hostname (a UTS namespace), its own FM_HOME (disk), the
    same store, and a wall clock SKEW_S ahead for every call (libfaketime, which shifts the
    monotonic clock by the same constant: only its differences mean anything, and they stay
    true; leaving it alone breaks libfaketime's absolute-deadline sleeps)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FM_", "TORCHELASTIC_"))}
    env.update(FM_HOME=str(job_file.parent), FM_STORE_URI=str(ws.store_dir),
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", LD_PRELOAD=lib,
               FAKETIME=f"+{SKEW_S}s")
    torchrun = [*torchrun_executable(), "--standalone",
                "--local-addr=127.0.0.1", f"--nproc-per-node={nproc}",
                "-m", "fm_pipeline.train", "--job", str(job_file)]
    argv = ["unshare", "--uts", "--", "sh", "-c", 'hostname node-b && exec "$@"', "sh",
            *torchrun]
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[3])
    except FileNotFoundError as e:
        raise Unavailable(f"cannot start a process in its own UTS namespace: {e}") from e
