"""A training job's history as its run directory records it: every launch (torchrun segment)
with its steps and how it ended, which steps were kept and which were redone after a
resume (lost work), the checkpoints and their held-out evaluations.

    history = read_run_history("demo-1", site.runs_dir("demo-1"), store=site.store())
    history.lost_steps, history.summary()["final_loss"]

Sources (fm_pipeline/rundir/records.py documents the files): <run directory>/metrics.jsonl
(steps), segments.jsonl (one record per launch, also on failure; absent for a launch that
was killed or is still running), and the committed checkpoints of both tiers with their
`eval` marks (written by fm_pipeline.eval).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import median


class NoMetrics(ValueError):
    """The job has no step records to report on."""


@dataclass
class Launch:
    """One torchrun launch of the job (a segment, in the trainer's words)."""

    segment: str  # the trainer's id: "<start step:08d>-<random>"
    start_step: int  # the step it restored (0 on a fresh start)
    steps: list[dict] = field(default_factory=list)  # its metrics records, file order
    record: dict | None = None  # its segments.jsonl record

    @property
    def outcome(self) -> str:
        """completed | preempted | failed | nothing_to_do | no end record (killed or running)."""
        return self.record.get("exit_reason", "unknown") if self.record else "no end record"

    @property
    def end_step(self) -> int:
        """The last step it reached."""
        if self.record and self.record.get("end_step") is not None:
            return int(self.record["end_step"])
        return self.steps[-1]["step"] if self.steps else self.start_step

    @property
    def interrupted(self) -> bool:
        return self.outcome not in ("completed", "nothing_to_do")

    @property
    def started_at(self) -> float:
        times = [r["time"] for r in self.steps if "time" in r]
        if self.record and "time" in self.record:
            times.append(self.record["time"] - float(self.record.get("wall_s") or 0.0))
        return min(times, default=float("inf"))


@dataclass
class Checkpoint:
    step: int
    committed: bool  # a copy with its manifest still exists (retention may have removed it)
    evaluation: dict | None = None  # the eval mark: {"domains": {name: {"loss": ...}}, "loss"}

    def heldout(self) -> dict[str, float]:
        """Held-out loss per domain, and "all domains" (token-weighted), when evaluated."""
        if not self.evaluation:
            return {}
        out = {name: d["loss"] for name, d in (self.evaluation.get("domains") or {}).items()
               if d.get("loss") is not None}
        if self.evaluation.get("loss") is not None:
            out["all domains"] = self.evaluation["loss"]
        return out


@dataclass
class RunHistory:
    job: str
    directory: Path
    launches: list[Launch]
    checkpoints: list[Checkpoint]
    # The initial model's evaluation (EvalResult.to_dict() of evaluate_at_init), when the
    # caller has one: the held-out curve then starts at step 0. Not stored on disk.
    baseline: dict | None = None

    def evaluations(self) -> list[Checkpoint]:
        """Evaluated checkpoints, oldest first, after the initial model's when given."""
        start = [Checkpoint(0, committed=False, evaluation=self.baseline)] if self.baseline else []
        return [c for c in start + self.checkpoints if c.heldout()]

    def kept(self) -> list[dict]:
        """One record per step: the latest launch's (what the model's weights went through)."""
        by_step: dict[int, dict] = {}
        for launch in self.launches:
            for r in launch.steps:
                by_step[r["step"]] = r
        return [by_step[s] for s in sorted(by_step)]

    def lost(self, launch: Launch) -> list[dict]:
        """Records of `launch` that a later launch redid from an older checkpoint."""
        restart = self._next_restart(launch)
        return [] if restart is None else [r for r in launch.steps if r["step"] > restart]

    def lost_steps_of(self, launch: Launch) -> int:
        """Steps trained by `launch` and thrown away (counted from steps, not log lines)."""
        restart = self._next_restart(launch)
        return 0 if restart is None else max(0, launch.end_step - restart)

    @property
    def lost_steps(self) -> int:
        return sum(self.lost_steps_of(launch) for launch in self.launches)

    def _next_restart(self, launch: Launch) -> int | None:
        later = self.launches[self.launches.index(launch) + 1:]
        return min((other.start_step for other in later), default=None)

    def summary(self) -> dict:
        kept = self.kept()
        last = kept[-1]

        def med(key: str) -> float | None:
            values = [r[key] for r in kept if isinstance(r.get(key), (int, float))]
            return median(values) if values else None

        return {
            "job": self.job,
            "step": last["step"],
            "target_step": max((launch.record.get("target_step") or 0 for launch in self.launches
                                if launch.record), default=None) or None,
            "launches": len(self.launches),
            "failures": sum(launch.outcome == "failed" for launch in self.launches),
            "preemptions": sum(launch.outcome == "preempted" for launch in self.launches),
            "lost_steps": self.lost_steps,
            "final_loss": last["loss"],
            "median_step_time_s": med("step_time_s"),
            "median_mfu": med("mfu"),
            "median_tokens_per_s": med("tokens_per_s"),
            "tokens_seen": last.get("tokens_seen"),
            "checkpoints": [c.step for c in self.checkpoints],
            "evaluated": [c.step for c in self.checkpoints if c.evaluation],
        }


def read_run_history(job: str, directory: Path, *, store=None) -> RunHistory:
    """The job's history from its run directory (site.runs_dir(job)) and, when given, the
    object store's checkpoint copies. Raises NoMetrics, naming the job and the file, if no
    step was recorded."""
    directory = Path(directory)
    from fm_pipeline.rundir.records import METRICS_FILE, SEGMENTS_FILE

    steps = _records(directory / METRICS_FILE, "step")
    if not steps:
        raise NoMetrics(f"job {job!r} has no training metrics: no step records in "
                        f"{directory / METRICS_FILE} (has a segment of it run yet?)")
    launches: dict[str, Launch] = {}
    for r in steps:
        launch = launches.setdefault(r["segment"], Launch(r["segment"], _start_of(r["segment"])))
        launch.steps.append(r)
    for r in _records(directory / SEGMENTS_FILE, "segment"):
        launch = launches.setdefault(r["segment"], Launch(r["segment"], _start_of(r["segment"])))
        launch.record = r
        if r.get("start_step") is not None:
            launch.start_step = int(r["start_step"])
    ordered = sorted(launches.values(), key=lambda launch: launch.started_at)
    return RunHistory(job=job, directory=directory, launches=ordered,
                      checkpoints=_checkpoints(job, directory, steps, store))


def _start_of(segment_id: str) -> int:
    head = segment_id.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def _records(path: Path, kind: str) -> list[dict]:
    """Records of one kind that name their launch (torn last lines are skipped)."""
    from fm_pipeline.rundir.records import read_records

    return [r for r in read_records(path, kind) if "segment" in r
            and (kind != "step" or isinstance(r.get("step"), int))]


def _checkpoints(job: str, directory: Path, steps: list[dict], store) -> list[Checkpoint]:
    """Saves seen in the metrics (a step that blocked on a save) and committed copies."""
    found: dict[int, Checkpoint] = {
        r["step"]: Checkpoint(r["step"], committed=False)
        for r in steps if (r.get("checkpoint_block_s") or 0) > 0}
    for step, mark in _committed_evals(job, directory, store).items():
        found[step] = Checkpoint(step, committed=True, evaluation=mark)
    return [found[s] for s in sorted(found)]


def _committed_evals(job: str, directory: Path, store) -> dict[int, dict | None]:
    """step -> eval mark (or None) of every committed checkpoint, local tier first."""
    from fm_pipeline.catalog.marks import read_mark
    from fm_pipeline.catalog.refs import MANIFEST, list_local, list_store, store_root
    from fm_pipeline.storage import StoreError

    refs = list_local(directory / "checkpoints")
    if store is not None:
        try:
            refs += list_store(store, store_root(job))
        except StoreError:  # the local tier still answers while the store is down
            pass
    out: dict[int, dict | None] = {}
    for ref in refs:
        if not ref.has(MANIFEST):
            continue
        mark = read_mark(ref, "eval")
        if mark and not mark.get("unreadable"):
            out[ref.step] = mark
        else:
            out.setdefault(ref.step, None)
    return out
