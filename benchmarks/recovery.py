"""Time from a rank's failure to the resumed segment's first step, through the Dagster daemon.

    python -m benchmarks.recovery [--repeats 5] [--backoff-s 2]

A real deployment on this machine (deploy/instance.py's dagster.yaml, a `dagster-daemon`:
intake, failure and progress sensors, the run queue, the local run launcher) and small real
jobs (debug model, one CPU rank, torchrun): each job is submitted with a fault planted at
step 3 (rank 0 raises after logging it), fails, and is resumed from its step-2 checkpoint by
the daemon's sensors. Per job, from the run records' events, the segment directories and the
trainer's records (all timestamps of this machine):

  detection_s      fault -> the failed run's end (torchrun sees the worker die, the launcher
                   reads the error files, the run is marked failed)
  failure_sensor_s run failed -> the failure sensor's decision (its tick)
  backoff_s        the retry policy's wait (excluded from durable_resume_s)
  resume_tick_s    decision (or backoff's end) -> the resume run created by a sensor
  queue_s          created -> taken from the run queue and handed to the run launcher
  launch_s         -> the run worker process started by the code server
  process_start_s  worker started -> the run started (imports, definitions load)
  step_setup_s     run started -> torchrun started (the segment asset: registry, plan,
                   MLflow run, the segment's checks)
  trainer_start_s  torchrun started -> the first step began, less the restore (torchrun,
                   the worker process, torch import, model and optimizer build)
  restore_s        the trainer's checkpoint restore
  first_step_s     the first step itself
  durable_resume_s fault -> the resumed segment's first step completed, backoff excluded

Baseline, same run, like for like: cold_start_s, a job's submission -> its first step (the
same intake, queue, launch and trainer start, no failure, no restore). Target on 2 cores:
durable_resume_s <= 30.

In-job restart (the fast tier, docs/checkpoints.md), same daemon, same job and fault, with
`checkpoint.memory_every_steps` 2 and `resilience.inplace_restarts` 1: the worker's
process, still alive, runs the segment again inside the same run (train/inprocess.py) and
restores the newest in-memory snapshot; and the same with `resilience.inprocess_restart`
off, torchrun's restart of the worker process (what a killed worker gets):

  inplace_resume_s     fault -> the restarted attempt's first step completed (in-process)
  inplace_process_resume_s   the same through torchrun's new worker process
  inplace_steps_redone steps trained again after the restore
  inplace_restore_s    the restarted worker's restore (from memory)
  snapshot_block_ratio loop time blocked by snapshots / step time, over the restarted
                       attempt (the loop's share lost to the fast tier at interval 2)

Targets on 2 cores: inplace_resume_s <= 10 and <= durable_resume_s / 5 (same run).

With peers to tear down and meet again, the same daemon and fault:

  inplace_resume_s_2_ranks   a 2-rank job (torchrun, gloo, FSDP2) restarting in its
                             processes; durable_resume_s_2_ranks: the same job without the
                             fast tier, failed and resumed by the daemon's sensors
  inplace_resume_s_2_nodes   2 nodes x 2 ranks in network namespaces (no daemon: the pod
                             command as two nodes, benchmarks/recovery_nodes.py);
                             durable_resume_s_2_nodes: the same job's pods created again,
                             restoring the durable checkpoint

A lost node (fm_pipeline.resilience.scenarios.fast, no daemon: one launch of the pod
command, 2 nodes x 2 ranks in network namespaces where this machine allows them; torch's
default rendezvous heartbeat, 5 s):

  peer_resume_s        node 1 SIGKILLed -> the first step after a spare joined and ranks
                       2, 3 restored from node 0's replicas
  peer_restore_s       that restore (the replicas sent over the tier's group)
  peer_steps_redone    steps trained again after it

Last stdout line: one JSON object (medians; each field's spread in "spread", max - min).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

STEPS, FAULT = 8, "0:3"
console = Console(stderr=True)


def runs_dir(job_name: str) -> Path:
    """The job's run directory under the site this benchmark set up (FM_HOME)."""
    from fm_pipeline.config.site import Site

    return Site.from_environ().runs_dir(job_name)


def _events(instance, run_id: str) -> dict[str, float]:
    """The first timestamp of each lifecycle event of the run."""
    from dagster import DagsterEventType

    wanted = {DagsterEventType.RUN_ENQUEUED: "enqueued", DagsterEventType.RUN_STARTING:
              "launching", DagsterEventType.RUN_START: "started",
              DagsterEventType.RUN_FAILURE: "failed", DagsterEventType.RUN_SUCCESS: "succeeded"}
    out: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            continue
        name = wanted.get(event.event_type)
        if name is None and (entry.message or "").startswith("Started process for run"):
            name = "worker_started"
        if name and name not in out:
            out[name] = entry.timestamp
    return out


def _steps(job_name: str) -> list[list[dict]]:
    """The trainer's step records per launch, in order."""
    launches: dict[str, list[dict]] = {}
    path = runs_dir(job_name) / "metrics.jsonl"
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "step":
            launches.setdefault(record["segment"], []).append(record)
    return list(launches.values())


def _segment_records(job_name: str) -> list[dict]:
    from fm_pipeline.rundir.records import SEGMENTS_FILE, read_records

    return read_records(runs_dir(job_name) / SEGMENTS_FILE, "segment")


def _torchrun_starts(job_name: str) -> list[float]:
    """When each launch's torchrun started (its segment directory's UTC stamp)."""
    starts = []
    for d in (runs_dir(job_name) / "segments").iterdir():
        stamp = datetime.strptime(d.name.split("-", 1)[1], "%Y%m%dT%H%M%S%f")
        starts.append(stamp.replace(tzinfo=timezone.utc).timestamp())
    return sorted(starts)


def _decided_at(instance, job_name: str) -> float:
    """The failure sensor's decision: the observation it records on the job's partition."""
    from dagster import AssetKey, AssetRecordsFilter

    records = instance.fetch_observations(AssetRecordsFilter(
        asset_key=AssetKey("training_segment"), asset_partitions=[job_name]), limit=10).records
    return min(r.timestamp for r in records)


def measure(instance, job_name: str, submitted_at: float) -> dict:
    from fm_pipeline.dagster_runs.api_jobs import api_run_records

    (records,) = api_run_records(instance, job_name).values()
    failed = next(r.dagster_run for r in records if r.dagster_run.status.value == "FAILURE")
    resumed = next(r for r in records if r.dagster_run.tags.get("fm/resumes_run")
                   == failed.run_id)
    first_launch, second_launch = _steps(job_name)[:2]
    fault_at = first_launch[-1]["time"]  # the fault raises right after this record
    failed_events = _events(instance, failed.run_id)
    ev = _events(instance, resumed.dagster_run.run_id)
    decided = _decided_at(instance, job_name)
    resume_at = float(failed.tags.get("fm/resume_at", decided))
    backoff = max(0.0, resume_at - decided)
    created = resumed.create_timestamp.timestamp()
    torchrun = [t for t in _torchrun_starts(job_name) if t > ev["started"]][0]
    first = second_launch[0]
    restore = next(s for s in _segment_records(job_name) if s.get("restored_from"))["restore_s"]
    step_began = first["time"] - first["step_time_s"]
    cold = first_launch[0]["time"] - submitted_at
    return {
        "detection_s": failed_events["failed"] - fault_at,
        "failure_sensor_s": decided - failed_events["failed"],
        "backoff_s": backoff,
        "resume_tick_s": created - max(decided, resume_at),
        "queue_s": ev["launching"] - ev.get("enqueued", created),
        "launch_s": ev["worker_started"] - ev["launching"],
        "process_start_s": ev["started"] - ev["worker_started"],
        "step_setup_s": torchrun - ev["started"],
        "trainer_start_s": step_began - torchrun - restore,
        "restore_s": restore,
        "first_step_s": first["step_time_s"],
        "durable_resume_s": first["time"] - fault_at - backoff,
        "cold_start_s": cold,
    }


def measure_inplace(job_name: str, *, in_process: bool) -> dict:
    """The in-job restart of one job: both attempts are one Dagster run, one launch; the
    restart took the path asked for (in the process, or torchrun's new worker)."""
    attempts = _steps(job_name)
    first, restarted = attempts[0], attempts[1]
    fault_at = first[-1]["time"]
    segment = next(s for s in _segment_records(job_name) if s.get("inplace_restart"))
    restart, fast = segment["inplace_restart"], segment["fast_tier"] or {}
    if restart["in_process"] != in_process:
        raise RuntimeError(f"{job_name}: the restart was {'not ' * in_process}in the "
                           f"process: {restart}")
    step_time = sum(r["step_time_s"] for r in restarted)
    return {
        "inplace_resume_s": restarted[0]["time"] - fault_at,
        "inplace_steps_redone": restart["steps_redone"],
        "inplace_restore_s": restart["restore_s"],
        "snapshot_block_ratio": fast.get("blocked_s", 0.0) / step_time if step_time else 0.0,
    }


def measure_node_loss(home: Path) -> dict:
    """The scenario's second fault (a whole node lost, a spare joins): its figures."""
    from fm_pipeline.resilience.scenarios.fast import run_fast_faults
    from fm_pipeline.resilience.workspace import ChaosWorkspace

    ws = ChaosWorkspace(home)
    with ws.active():
        run = run_fast_faults(ws, keep_alive_s=None)
    if not run.result.passed:
        raise RuntimeError(f"node-loss run failed: {run.result.failed_checks()} "
                           f"({run.result.outcome})")
    peer = run.restarts[1]
    return {"peer_resume_s": run.resume_s[1], "peer_restore_s": peer["restore_s"],
            "peer_steps_redone": peer["steps_redone"]}


def _wait_done(instance, job_name: str) -> None:
    """Until the job's API run (number 1: its segment runs, resumes included) ends."""
    from fm_pipeline.dagster_runs.api_jobs import run_infos

    deadline = time.monotonic() + 600
    while True:
        infos = run_infos(instance, job_name, target_step=STEPS)
        if infos and infos[1].state in ("succeeded", "failed", "cancelled"):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_name} did not finish in 600 s")
        time.sleep(0.5)
    if infos[1].state != "succeeded":
        raise RuntimeError(f"{job_name}: {infos[1].state}: {infos[1].reason}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backoff-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fm-recovery-"))
    store_dir = root / "store"
    os.environ.update({"FM_HOME": str(root), "DAGSTER_HOME": str(root / "dagster"),
                       "FM_STORE_URI": str(store_dir), "MLFLOW_LOGGING_LEVEL": "WARNING"})
    from dagster import DagsterInstance

    from fm_pipeline.dagster_runs.submit import register_training_job
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.deploy.instance import write_instance
    from fm_pipeline.deploy.services import daemon, default_signal_dispositions, running
    from fm_pipeline.orchestration.registry import plant_fault
    from fm_pipeline.orchestration.submissions import submit_run
    from fm_pipeline.storage import open_store

    from benchmarks.recovery_nodes import measure_two_nodes

    default_signal_dispositions()
    store = open_store(str(store_dir))
    build_small_mix(small_job(), store=store)
    home = write_instance(root / "dagster")
    env = {"FM_HOME": str(root), "FM_STORE_URI": str(store_dir), "FM_LAUNCHER_ECHO": "0",
           "FM_RETRY_BACKOFF_S": str(args.backoff_s), "MLFLOW_LOGGING_LEVEL": "WARNING"}
    runs = []
    with Progress(console=console) as progress, running(daemon(home, env=env)):
        instance = DagsterInstance.get()
        task = progress.add_task("fault -> resumed first step", total=args.repeats)
        for i in range(args.repeats):
            job = small_job(**{"name": f"recovery-{i}", "training.steps": STEPS,
                               "training.segment_steps": STEPS,
                               "checkpoint.every_steps": 2})
            register_training_job(instance, job, store=store)
            plant_fault(store, job.name, FAULT)
            submitted_at = time.time()
            submit_run(store, job)
            _wait_done(instance, job.name)
            run = measure(instance, job.name, submitted_at)
            measured = {}
            for label, in_process in (("inplace", True), ("process", False)):
                inplace = small_job(**{"name": f"recovery-{label}-{i}", "training.steps": STEPS,
                                       "training.segment_steps": STEPS,
                                       "checkpoint.every_steps": 2,
                                       "checkpoint.memory_every_steps": 2,
                                       "resilience.inplace_restarts": 1,
                                       "resilience.inprocess_restart": in_process})
                register_training_job(instance, inplace, store=store)
                plant_fault(store, inplace.name, FAULT)
                submit_run(store, inplace)
                _wait_done(instance, inplace.name)
                figures = measure_inplace(inplace.name, in_process=in_process)
                if in_process:
                    measured.update(figures)
                else:
                    measured["inplace_process_resume_s"] = figures["inplace_resume_s"]
            for label, inplace in (("durable", False), ("inplace", True)):
                pair = small_job(**{"name": f"recovery-2r-{label}-{i}", "training.steps": STEPS,
                                    "training.segment_steps": STEPS,
                                    "checkpoint.every_steps": 2,
                                    "parallelism.nproc_per_node": 2,
                                    **({"checkpoint.memory_every_steps": 2,
                                        "resilience.inplace_restarts": 1} if inplace else {})})
                register_training_job(instance, pair, store=store)
                plant_fault(store, pair.name, FAULT)
                started = time.time()
                submit_run(store, pair)
                _wait_done(instance, pair.name)
                if inplace:
                    measured["inplace_resume_s_2_ranks"] = measure_inplace(
                        pair.name, in_process=True)["inplace_resume_s"]
                else:
                    measured["durable_resume_s_2_ranks"] = measure(
                        instance, pair.name, started)["durable_resume_s"]
            runs.append({**run, **measured})
            progress.update(task, advance=1, description=(
                f"durable_resume_s {runs[-1]['durable_resume_s']:.1f}, "
                f"inplace_resume_s {runs[-1]['inplace_resume_s']:.1f}, "
                f"process {runs[-1]['inplace_process_resume_s']:.1f}"))
        instance.dispose()
        for i, run in enumerate(runs):
            run.update(measure_node_loss(root / f"node-loss-{i}"))
            run.update(measure_two_nodes(root / f"two-nodes-{i}", i))
            progress.update(task, description=(
                f"peer_resume_s {run['peer_resume_s']:.1f}, 2 nodes in place "
                f"{run['inplace_resume_s_2_nodes']:.1f} / durable "
                f"{run['durable_resume_s_2_nodes']:.1f}"))
    keys = list(runs[0])
    result = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    result["spread"] = {k: round(max(r[k] for r in runs) - min(r[k] for r in runs), 3)
                        for k in keys}
    for suffix in ("", "_2_ranks", "_2_nodes"):
        ratios = [r[f"durable_resume_s{suffix}"] / r[f"inplace_resume_s{suffix}"] for r in runs]
        result[f"durable_over_inplace{suffix}"] = round(statistics.median(ratios), 3)
        result["spread"][f"durable_over_inplace{suffix}"] = round(max(ratios) - min(ratios), 3)
    result.update({"repeats": len(runs), "target_durable_resume_s": 30.0,
                   "target_inplace_resume_s": 10.0, "target_durable_over_inplace": 5.0,
                   "cpu_count": os.cpu_count(), "runs": runs})
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
