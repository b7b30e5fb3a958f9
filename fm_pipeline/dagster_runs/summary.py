"""A training job's story, read back from the Dagster instance: every segment attempt with
its step range, numbers and (for failures) the sensor's decision; every checkpoint with its
evaluation and drill; the job's goodput. `fm demo` prints it; anything else may render it.

    report = job_report(instance, "demo-1", runs=site.runs_dir("demo-1"))
    report.segments[0]["mean_mfu"], report.checkpoints[-1]["eval"]["prose/loss"]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster import AssetKey, AssetRecordsFilter, DagsterRunStatus
from fm_pipeline.dagster_runs.history import recorded_checkpoints
from fm_pipeline.dagster_runs.history import (
    segment_metadata,
    segment_run_records,
    step_failure,
)
from fm_pipeline.dagster_runs.names import (
    TAG_DECISION,
    TAG_DECISION_REASON,
    TAG_END,
    TAG_FAILED_AT,
    TAG_RESUME_FROM,
    TAG_START,
    TAG_TRIGGER,
)

from fm_pipeline.orchestration import job_goodput
from fm_pipeline.orchestration.goodput import straggler_costs
from fm_pipeline.rundir.events import read_events


@dataclass
class JobReport:
    job: str
    segments: list[dict] = field(default_factory=list)  # oldest first
    checkpoints: list[dict] = field(default_factory=list)  # oldest first
    goodput: float | None = None
    # stops, restart_s, idle_gpu_s (orchestration.goodput.straggler_costs)
    stragglers: dict = field(default_factory=dict)

    @property
    def reached_step(self) -> int:
        done = [s["end_step"] for s in self.segments if s["status"] == "SUCCESS"]
        return max(done, default=0)


def _by_checkpoint(instance, key: str, job_name: str) -> dict[int, dict]:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(key), asset_partitions=[job_name]),
        limit=1000, ascending=True).records
    out = {}
    for record in records:  # the newest evaluation / drill of a step wins
        meta = {k: getattr(v, "value", v) for k, v in
                record.asset_materialization.metadata.items()}
        out[int(meta["checkpoint_step"])] = meta
    return out


def job_report(instance, job_name: str, *, runs) -> JobReport:
    """The job's segments, checkpoints and goodput from the instance, its straggler costs
    from the event log in its run directory `runs`."""
    report = JobReport(job=job_name)
    for record in reversed(segment_run_records(instance, job_name, limit=1000)):
        run = record.dagster_run
        if run.status not in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE,
                              DagsterRunStatus.CANCELED):
            continue
        tags = run.tags
        row = {"run_id": run.run_id, "status": run.status.value,
               "trigger": tags.get(TAG_TRIGGER, "?"),
               "start_step": int(tags.get(TAG_START, -1)), "end_step": int(tags.get(TAG_END, -1)),
               "resume_from": tags.get(TAG_RESUME_FROM)}
        if run.status == DagsterRunStatus.SUCCESS:
            row.update(segment_metadata(instance, run.run_id))
        else:
            meta, description = step_failure(instance, run.run_id)
            row.update({"reason": str(meta.get("reason") or description),
                        "wall_s": meta.get("duration_s"),
                        "failed_at_step": int(tags.get(TAG_FAILED_AT, meta.get(
                            "failed_at_step", -1))),
                        "decision": tags.get(TAG_DECISION),
                        "decision_reason": tags.get(TAG_DECISION_REASON)})
        report.segments.append(row)
    evals = _by_checkpoint(instance, "evaluation", job_name)
    drills = _by_checkpoint(instance, "restore_drill", job_name)
    for ckpt in sorted(recorded_checkpoints(instance, job_name), key=lambda r: r["step"]):
        if report.checkpoints and report.checkpoints[-1]["step"] == ckpt["step"]:
            continue  # re-recorded
        report.checkpoints.append({**ckpt, "eval": evals.get(ckpt["step"]),
                                   "drill": drills.get(ckpt["step"])})
    done = [s for s in report.segments if s["status"] == "SUCCESS" and s.get("step_time_s")]
    walls = [float(s["wall_s"]) for s in report.segments if s.get("wall_s") is not None]
    report.goodput = job_goodput(reached_step=report.reached_step,
                                 step_times_s=[s["step_time_s"] for s in done],
                                 launch_wall_s=walls)
    ended, _ = read_events(runs, kinds=("straggler_end",))
    drops, _ = read_events(runs, kinds=("straggler_drop_end",))
    report.stragglers = straggler_costs(report.segments, ended, drops)
    return report
