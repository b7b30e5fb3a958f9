"""One training segment, as the orchestrator prepares and closes it (no Dagster here: the
`training_segment` asset calls these and only adds the run's context and its metadata).

    plan = plan_segment(job, store, site=site, resume_from="", end_step=0)  # SegmentNotRunnable
    plan.start, plan.end, plan.checkpoint
    segment = prepare_segment(job, store, site=site, end_step=0)         # + stop, data, stragglers
    segment.start, segment.end, segment.resume_from
    metadata = failure_metadata(segment, launcher_metadata, failed_at_step=37, mlflow_run=id)

Where a segment starts: the checkpoint it is asked to resume from (a committed checkpoint of
the job, either tier), else the newest valid one, else step 0; where it ends: the asked end
step, else the next segment boundary. A segment that cannot run (nothing left to train, a
resume_from that is not one of the job's checkpoints, a data mix that is not ready) is
refused before anything launches, as a bad config: retrying cannot help.
"""

from __future__ import annotations

from dataclasses import dataclass

SCRATCH = "scratch"  # a plan that starts from no checkpoint


class SegmentNotRunnable(ValueError):
    """Why this segment must not launch; `metadata` goes on the failed run."""

    def __init__(self, message: str, **metadata):
        self.metadata = {"outcome": "bad_config", "reason": message, **metadata}
        super().__init__(message)


@dataclass(frozen=True)
class PreparedSegment:
    job: object  # JobSpec, as registered
    start: int
    end: int
    resume_from: str | None  # the checkpoint it starts from (None: scratch)
    chosen: bool  # resume_from was asked for (a rollback), not discovered
    # What launches: the job without its excluded straggler slots (a smaller world that
    # reshards on restore) or avoiding their hosts; fm_pipeline.stragglers.mitigation.
    exclusion: object = None  # ExclusionPlan, or None when nothing is excluded

    @property
    def launch_job(self):
        return self.exclusion.job if self.exclusion is not None else self.job

    @property
    def launch_env(self) -> dict[str, str]:
        return dict(self.exclusion.env) if self.exclusion is not None else {}

    @property
    def avoid_hosts(self) -> tuple[str, ...]:
        return self.exclusion.avoid_hosts if self.exclusion is not None else ()

    @property
    def name(self) -> str:
        return f"steps-{self.start}-{self.end}"


def plan_tiers(job, target: str) -> tuple[str, ...]:
    """The checkpoint tiers a plan may name for a launch on `target`. A Kubernetes segment's
    pods keep their local tier on their own nodes (or the claim), not in this process's
    checkpoints directory: with uploads on, its plan names the store's copy, which every pod
    reads; without, what this process sees is all there is to go on."""
    if target == "kubernetes" and job.checkpoint.upload:
        return ("store",)
    return ("local", "store")


def newest_valid_step(job, store, *, site,
                      tiers: tuple[str, ...] = ("local", "store")) -> tuple[int, str | None]:
    """(step, location) of the checkpoint the next segment resumes from; (0, None) if none.
    Structure, sizes and model only: the trainer's restore checks the checksums and torch's
    own metadata again before it loads, so the control side neither repeats that work nor
    imports torch for it (~2.5 s per segment run on 2 cores)."""
    from fm_pipeline.catalog import latest_valid

    found = latest_valid(job, store=store, checksums=False, dcp=False, tiers=tiers,
                         root=site.checkpoints_dir(job.name))
    return (found.found.step, found.found.location) if found.found else (0, None)


def checkpoint_step(job, store, location: str, *, site) -> int:
    """The step of the job's checkpoint at `location` (either tier); ValueError if it is not
    one of the job's checkpoints."""
    from fm_pipeline.catalog.validate import candidates

    refs = candidates(job.name, store=store, root=site.checkpoints_dir(job.name))
    for ref in refs:
        if ref.location.rstrip("/") == location.rstrip("/"):
            return ref.step
    known = ", ".join(sorted({r.location for r in refs})) or "none"
    raise ValueError(f"resume_from {location!r} is not a checkpoint of job {job.name} "
                     f"(its checkpoints: {known})")


@dataclass(frozen=True)
class SegmentPlan:
    """Where a segment starts, ends and restores from: decided once, by plan_segment, and
    carried to the launcher and to the trainer (--resume-from, with --planned unless the
    user chose the checkpoint)."""

    start: int
    end: int
    checkpoint: str | None  # the location it restores (None: from scratch)
    chosen: bool = False  # a checkpoint the user asked for (a rollback), not discovered


def plan_segment(job, store, *, site, resume_from: str = "",
                 end_step: int = 0, target: str = "local") -> SegmentPlan:
    """The one function that decides a segment's plan, wherever it is asked (the API, the
    intake and failure sensors, the segment asset, the local orchestrator): from
    `resume_from` (one of the job's checkpoints, either tier) or the newest valid one, else
    step 0; to `end_step` or the spec's next segment boundary. SegmentNotRunnable (a
    ValueError) when the checkpoint is not the job's or nothing is left to train. `site`
    (config.site.Site) holds the job's local checkpoint tier; `target` ("local" |
    "kubernetes") where the segment runs (plan_tiers)."""
    if resume_from:
        try:
            start = checkpoint_step(job, store, resume_from, site=site)
        except ValueError as e:
            raise SegmentNotRunnable(str(e)) from None
        location = resume_from
    else:
        start, location = newest_valid_step(job, store, site=site,
                                            tiers=plan_tiers(job, target))
    end = end_step or job.training.segment_end(start)
    if start >= job.training.steps or end <= start:
        raise SegmentNotRunnable(
            f"job {job.name} is at step {start}; a segment to step {end} has nothing to train "
            f"(target {job.training.steps})", start_step=start, end_step=end)
    return SegmentPlan(start=start, end=end, checkpoint=location, chosen=bool(resume_from))


def prepare_segment(job, store, *, site, end_step: int = 0, resume_from: str = "",
                    planned_start: str = "", api_run: int | None = None,
                    target: str = "local") -> PreparedSegment:
    """The segment's plan (plan_segment), checked before anything launches, and what
    launches after the job's straggler exclusions (`target`: "local" | "kubernetes").
    `planned_start`: the checkpoint (or "scratch") the run's request planned to start from;
    when a checkpoint was committed or found invalid since, the launch follows today's
    plan and the job's event log says why ("segment_replanned"). A
    segment of training run `api_run` that a control plane stopped (submissions.request_stop)
    does not launch: SegmentNotRunnable with outcome "stopped"."""
    from fm_pipeline.data import DataError, open_job_mix
    from fm_pipeline.orchestration.submissions import stop_of

    if api_run is not None:
        stop = stop_of(store, job.name, api_run)
        if stop is not None:
            raise SegmentNotRunnable(f"training run {api_run} of {job.name} was stopped "
                                     f"({stop.how}) before this segment started",
                                     outcome="stopped", stop=stop.how)
    plan = plan_segment(job, store, site=site, resume_from=resume_from, end_step=end_step,
                        target=target)
    runs = site.runs_dir(job.name)
    if planned_start and not resume_from and not same_checkpoint(planned_start,
                                                                 plan.checkpoint or SCRATCH):
        from fm_pipeline.rundir.events import append_event

        append_event(runs, "segment_replanned", planned=planned_start,
                     now=plan.checkpoint or SCRATCH, reason="the job's newest valid checkpoint "
                     "changed between the request and the launch")
    try:
        open_job_mix(job, store)
    except DataError as e:
        raise SegmentNotRunnable(f"data mix of {job.name} is not ready: {e}; materialize "
                                 "data_mix for this job spec first") from None
    _record_plan(runs, plan)
    return PreparedSegment(job=job, start=plan.start, end=plan.end,
                           resume_from=plan.checkpoint, chosen=plan.chosen,
                           exclusion=apply_exclusions(job, runs, target))


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two plans start from the same checkpoint: one step in either tier (a request
    planned where the control plane looks may name the local copy of what a Kubernetes
    launch names in the store), or both from scratch."""
    def name(location: str) -> str:
        return location.rstrip("/").rsplit("/", 1)[-1]

    return name(a) == name(b)


def _record_plan(runs, plan: SegmentPlan) -> None:
    """The plan of each segment that launches, in the job's event log ("segment_planned"):
    whichever orchestrator launched it, the same record."""
    from fm_pipeline.rundir.events import append_event

    append_event(runs, "segment_planned", start=plan.start, end=plan.end,
                 checkpoint=plan.checkpoint or SCRATCH, chosen=plan.chosen)


def apply_exclusions(job, runs, target: str):
    """The job's straggler exclusions as the next launch (an ExclusionPlan), recorded in its
    event log ("exclusion_applied") when the decision differs from the last one recorded, so
    a long job's log holds each change once, not one copy per launch; None when nothing is
    excluded. Exclusions the layout can no longer absorb launch the registered job and say
    why: training on goes before the straggler (the watch refuses such stops before they
    happen)."""
    from fm_pipeline.stragglers.mitigation import plan_after_stragglers

    try:
        plan = plan_after_stragglers(job, runs, target=target)
    except ValueError as e:
        _record_exclusion(runs, excluded=[], avoid_hosts=[],
                          world_size=job.parallelism.world_size,
                          world_size_before=job.parallelism.world_size, note=f"not applied: {e}")
        return None
    if not plan.changed:
        return None
    _record_exclusion(runs,
                      excluded=[{"host": s.host, "local_rank": s.local_rank, "rank": s.rank,
                                 "reason": s.reason} for s in plan.excluded],
                      avoid_hosts=list(plan.avoid_hosts),
                      world_size=plan.job.parallelism.world_size,
                      world_size_before=job.parallelism.world_size, note=plan.note)
    return plan


def _record_exclusion(runs, **decision) -> None:
    from fm_pipeline.rundir.events import append_event, read_events

    applied, _ = read_events(runs, kinds=("exclusion_applied",))
    if applied and {k: applied[-1].get(k) for k in decision} == decision:
        return
    append_event(runs, "exclusion_applied", **decision)


def failure_metadata(segment: PreparedSegment, launcher_metadata: dict | None, *,
                     failed_at_step: int | None, mlflow_run: str | None) -> dict:
    """What the failure sensor reads on a failed segment run: the launcher's outcome, exit
    code and reason, plus where the segment started, ended and failed."""
    return {**(launcher_metadata or {}), "start_step": segment.start, "end_step": segment.end,
            "failed_at_step": failed_at_step if failed_at_step is not None else -1,
            "resume_from": segment.resume_from or "scratch", "mlflow_run_id": mlflow_run}
