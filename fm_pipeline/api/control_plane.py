"""The control plane: validates and queues jobs, admits them through the fair-share
policy, drives the orchestrator, and assembles each job's status from the orchestrator's
runs and the job's own checkpoints and metrics.

    plane = ControlPlane(tenants=load_tenants(), orchestrator=orch, store=JobStore())
    record = plane.submit(principal, JobCreate(...))
    plane.reconcile()          # admit / preempt / notice ended runs; `fm api serve` ticks it

Every verb takes the calling `Principal`: a tenant sees and acts on its own jobs only
(another tenant's job is NotFound, exactly like a job that does not exist); an admin acts
on all. Stop requests: "preempt" (admin or policy), "cancel", "restart" (a resume of a
running job: stop it, then start again from the chosen checkpoint).

Several control-plane processes may serve one FM_HOME (two `fm api serve`, a CLI): every
verb and reconcile runs under the queue's exclusive hold (JobStore.exclusive) and re-reads
the fair-share queue from the store when another process changed it, so each decides on
what the others committed, and the orchestrator's records (Dagster's, shared by all) say
what runs. Per process still: the preemption budget and the victims a preemptor waits for.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import NamedTuple

from fm_pipeline.api import progress
from fm_pipeline.api.auth import Principal
from fm_pipeline.api.errors import Conflict, FieldError, Forbidden, NotFound
from fm_pipeline.api.job_mapping import to_job_spec
from fm_pipeline.api.orchestrator import Orchestrator, RunInfo
from fm_pipeline.api.schemas import JobCreate
from fm_pipeline.api.store import JobRecord, JobStore
from fm_pipeline.config import PRIORITY_VALUES, JobSpec, parse_job
from fm_pipeline.config.site import Site
from fm_pipeline.failpoints import failpoint
from fm_pipeline.launch.capacity import LocalCapacity, local_fit_problems
from fm_pipeline.orchestration.registry import register_job, registered_digest, registered_job
from fm_pipeline.scheduling import AdmissionError, FairSharePolicy, JobRequest, TenantsConfig

log = logging.getLogger(__name__)
IDEMPOTENCY_S = 24 * 3600  # how long an Idempotency-Key names its job


class Submission(NamedTuple):
    record: JobRecord
    warnings: list
    replayed: bool = False  # an earlier call with the same Idempotency-Key made it


_FIT_FIELD = {"parallelism": "gpus", "model": "model"}  # launch.capacity's fields, as the body's


class ControlPlane:
    def __init__(self, *, tenants: TenantsConfig, orchestrator: Orchestrator, store: JobStore,
                 site: Site, clock: Callable[[], float] = time.time,
                 capacity: LocalCapacity | None = None):
        """`site`: where the jobs' specs, checkpoints and run directories are (config.site).
        `capacity`: the machine a local pool's jobs run on (default: this one, measured);
        unused when the pool feeds Kubernetes."""
        self.tenants = tenants
        if tenants.launcher == "local" and capacity is None:
            capacity = LocalCapacity.of_this_machine()
        self.capacity = capacity if tenants.launcher == "local" else None
        self.orchestrator = orchestrator
        self.store = store
        self.site = site
        self.clock = clock
        self.policy = FairSharePolicy(tenants, clock=clock)
        # job id -> why the tenants config cannot schedule it (its tenant is gone, it is
        # bigger than the pool now): left in the store, reported, never dropped silently.
        self.stranded: dict[str, str] = {}
        with self._locked():
            pass

    # -- verbs -------------------------------------------------------------------------

    def submit(self, who: Principal, body: JobCreate) -> JobRecord:
        return self.submit_with_warnings(who, body)[0]

    def submit_with_warnings(self, who: Principal, body: JobCreate, *,
                             idempotency_key: str | None = None) -> Submission:
        """The accepted job and the planner's critique of it (planner.critique): findings
        about what it declares, each with numbers and a suggestion; it is queued anyway.
        `idempotency_key`: a retry with the same key and body within IDEMPOTENCY_S gets the
        job the first call made (`replayed` True); the same key with another body
        is a Conflict."""
        if who.is_admin:
            raise Forbidden("admins do not own jobs: submit with a tenant's token")
        tenant = self.tenants.tenant(who.tenant)
        digest = _body_digest(body)
        if idempotency_key is not None:
            with self._locked():
                earlier = self._replay(tenant.name, idempotency_key, digest)
            if earlier is not None:
                return earlier
        job_id = "job-" + secrets.token_hex(5)
        pool = []  # reported with every other problem of the body, all at once
        try:
            self.policy.check(JobRequest.gpus(job_id, tenant.name, body.gpus,
                                              priority=PRIORITY_VALUES[body.priority], seq=0))
        except AdmissionError as e:
            pool.append(("gpus", str(e)))
        job = to_job_spec(body, job_id=job_id, tenant=tenant, store=self._object_store(),
                          problems=pool, cluster=self.tenants.cluster)
        if self.capacity is not None:  # refused before it is queued, let alone started
            misfit = local_fit_problems(job, self.capacity)
            if misfit:
                raise FieldError([(_FIT_FIELD.get(f, f), m) for f, m in misfit])
        warnings = critique_of(job)
        with self._locked():
            if idempotency_key is not None:  # another process may have won the race
                earlier = self._replay(tenant.name, idempotency_key, digest)
                if earlier is not None:
                    return earlier
                self.store.remember_idempotent(tenant.name, idempotency_key, body_sha256=digest,
                                               job_id=job_id, at=self.clock())
            record = self.store.add(
                job_id=job_id, tenant=tenant.name, priority=body.priority, gpus=body.gpus,
                request=body.model_dump(mode="json"), spec_sha256=self._register(job),
                submitted_at=self.clock(),
            )
            self.policy.submit(_request(record))
            self.store.add_event(job_id, "submitted", {"gpus": body.gpus, "priority": body.priority,
                                                       "warnings": warnings})
            log.info("job %s submitted by tenant %s (%d GPUs, %s)", job_id, tenant.name,
                     body.gpus, body.priority)
            self.reconcile()
            return Submission(self.store.get(job_id), warnings)

    def _replay(self, tenant: str, key: str, digest: str) -> Submission | None:
        found = self.store.idempotent(tenant, key, since=self.clock() - IDEMPOTENCY_S)
        if found is None:
            return None
        job_id, earlier_digest = found
        if earlier_digest != digest:
            raise Conflict(f"Idempotency-Key {key!r} was used for another body (job {job_id}); "
                           "use a new key for a new job")
        submitted = next((e for e in self.store.events(job_id) if e["kind"] == "submitted"), {})
        return Submission(self.store.get(job_id),
                          submitted.get("detail", {}).get("warnings", []), replayed=True)

    def cancel(self, who: Principal, job_id: str) -> str:
        with self._locked():
            record = self._visible(who, job_id)
            if record.queue_state == "queued":
                if job_id not in self.stranded:
                    self.policy.cancel(job_id)
                self.store.update(job_id, queue_state="done", cancelled_at=self.clock(),
                                  resume_checkpoint=None)
                self._event(job_id, "cancelled", by=who)
                return "cancelled"
            if record.queue_state == "admitted":
                if record.stop_requested != "cancel":
                    self.orchestrator.cancel(job_id)
                    self.store.update(job_id, stop_requested="cancel")
                    self._event(job_id, "cancel_requested", by=who)
                return "cancelling"
            raise Conflict(f"job {job_id} has already ended ({self._status(record)})")

    def preempt(self, who: Principal, job_id: str) -> str:
        if not who.is_admin:
            raise Forbidden("preempting a job needs an admin token")
        with self._locked():
            record = self._visible(who, job_id)
            if record.queue_state != "admitted" or record.stop_requested:
                raise Conflict(f"job {job_id} is not running ({self._status(record)})")
            self.orchestrator.preempt(job_id)
            self.store.update(job_id, stop_requested="preempt")
            self._event(job_id, "preempted", by=who, reason="admin")
            return "preempting"

    def resume(self, who: Principal, job_id: str, checkpoint: str | None) -> str:
        with self._locked():
            record = self._visible(who, job_id)
            location = self._checkpoint_location(job_id, checkpoint) if checkpoint else None
            status = self._status(record)
            if status == "succeeded":
                raise Conflict(f"job {job_id} already reached its target step")
            if record.queue_state == "queued" and not self._runs(job_id):
                raise Conflict(f"job {job_id} is queued and has not run yet")
            if record.stop_requested == "cancel":
                raise Conflict(f"job {job_id} is being cancelled")
            if record.queue_state == "admitted":  # restart a running job from a checkpoint
                if record.stop_requested is None:
                    self.orchestrator.preempt(job_id)
                self.store.update(job_id, stop_requested="restart", resume_checkpoint=location)
            elif record.queue_state == "queued":
                self.store.update(job_id, resume_checkpoint=location)
            else:  # ended (failed or cancelled): back to its original place in the queue
                self.store.update(job_id, queue_state="queued", cancelled_at=None,
                                  resume_checkpoint=location)
                self.policy.submit(_request(self.store.get(job_id)))
            if location:  # retention must not delete it before the restart reads it
                self._pin(job_id, location)
            self._event(job_id, "resume_requested", by=who, checkpoint=location or "latest valid")
            self.reconcile()
            return "restarting"

    def reconcile(self) -> None:
        """Notice ended runs, then admit and preempt what the policy decides."""
        with self._locked():
            for record in self.store.list(queue_state="admitted"):
                runs = self._runs(record.job_id)
                if runs and runs[-1].ended:
                    self._run_ended(record, runs[-1])
            decision = self.policy.schedule()
            for job_id in decision.admitted:
                self._launch(self.store.get(job_id))
            for p in decision.preempted:
                self.orchestrator.preempt(p.victim)
                self.store.update(p.victim, stop_requested="preempt")
                self.store.add_event(p.victim, "preempted", {"for": p.preemptor, "reason": p.reason},
                                     at=self.clock())
                log.info("job %s preempted for %s (%s)", p.victim, p.preemptor, p.reason)

    # -- reads -------------------------------------------------------------------------

    def status(self, who: Principal, job_id: str) -> dict:
        with self._locked():
            return self._assemble(self._visible(who, job_id))

    def list_jobs(self, who: Principal, *, tenant: str | None = None,
                  status: str | None = None) -> list[dict]:
        if not who.is_admin:
            if tenant not in (None, who.tenant):
                return []  # another tenant's jobs do not exist for this caller
            tenant = who.tenant
        with self._locked():
            jobs = [self._assemble(r) for r in self.store.list(tenant=tenant)]
        return [j for j in jobs if status in (None, j["status"])]

    def checkpoints(self, who: Principal, job_id: str) -> list[progress.CheckpointSeen]:
        self._visible(who, job_id)
        return progress.checkpoints(job_id, self._object_store(),
                                    root=self.site.checkpoints_dir(job_id))

    def evaluations(self, who: Principal, job_id: str) -> list[dict]:
        return [
            {"step": c.step, "checkpoint": c.location, "written_at": c.eval.get("written_at"),
             "results": {k: v for k, v in c.eval.items() if k not in ("mark", "written_at")}}
            for c in reversed(self.checkpoints(who, job_id)) if c.eval is not None
        ]

    def events(self, who: Principal, job_id: str) -> list[dict]:
        with self._locked():
            self._visible(who, job_id)
            events = self.store.events(job_id)
            for run in self._runs(job_id):
                events.append({"at": run.started_at, "kind": "run_started",
                               "detail": {"run_id": run.run_id, "resumed_from": run.resumed_from}})
                if run.ended:
                    events.append({"at": run.ended_at or run.started_at, "kind": f"run_{run.state}",
                                   "detail": {"run_id": run.run_id, "reason": run.reason}})
        events += progress.job_events(self.site.runs_dir(job_id))
        return sorted(events, key=lambda e: e["at"])

    def tenant_usage(self, who: Principal) -> list[dict]:
        with self._locked():
            rows = []
            for t in self.tenants.tenants:
                if not who.is_admin and t.name != who.tenant:
                    continue
                records = self.store.list(tenant=t.name)
                rows.append({
                    "tenant": t.name, "weight": t.weight, "quota_gpus": t.quota.get("gpu", 0),
                    "used_gpus": self.policy.usage(t.name).get("gpu", 0),
                    "share": round(self.policy.share(t.name), 6),
                    "queued": sum(r.queue_state == "queued" for r in records),
                    "running": sum(r.queue_state == "admitted" for r in records),
                    "priorities": list(t.priorities),
                })
            return rows

    # -- internals ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        """The queue held against every other thread and process; the policy re-read from
        the store on the outermost entry (another process may have changed it)."""
        with self.store.exclusive() as outermost:
            if outermost and self.store.changed_elsewhere():
                self._sync()
            yield

    def _sync(self) -> None:
        """Rebuild the policy's queue from the store (at start, and at each outermost hold:
        another process may have admitted, requeued or finished jobs meanwhile)."""
        self.policy = FairSharePolicy(self.tenants, clock=self.clock)
        reported, self.stranded = set(self.stranded), {}
        for record in self.store.list():
            if record.queue_state not in ("queued", "admitted"):
                continue
            runs = self._runs(record.job_id)
            if record.queue_state == "queued" and runs and not runs[-1].ended:
                # A process died between the orchestrator's start and the row's update:
                # the orchestrator's truth wins, the run holds its GPUs.
                self._adopt(record, runs[-1], why="running after a control-plane restart")
                record = self.store.get(record.job_id)
            try:
                if record.queue_state == "queued":
                    self.policy.submit(_request(record))
                else:
                    since = runs[-1].started_at if runs else record.submitted_at
                    self.policy.restore_running(_request(record), admitted_at=since)
            except AdmissionError as e:  # one such job must not stop every tenant's queue
                self.stranded[record.job_id] = str(e)
                if record.queue_state == "admitted":
                    self.policy.hold_outside(record.job_id, {"gpu": record.gpus})
        if self.stranded and set(self.stranded) != reported:  # once, not at every sync
            log.warning("%s", stranded_report(self.store, self.stranded))

    def _visible(self, who: Principal, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None or not (who.is_admin or record.tenant == who.tenant):
            raise NotFound(f"no job {job_id}")
        return record

    def _runs(self, job_id: str) -> list[RunInfo]:
        return self.orchestrator.status(job_id)

    def _object_store(self):
        return self.site.store()

    def _register(self, job: JobSpec) -> str:
        """The one stored copy of the spec (orchestration.registry); the queue keeps its
        sha256."""
        store = self._object_store()
        register_job(store, job)
        return registered_digest(store, job.name)

    def job_spec(self, job_id: str) -> JobSpec:
        """The spec job `job_id` was queued with (from the registry)."""
        record = self.store.get(job_id)
        if record is None:
            raise NotFound(f"no job {job_id}")
        return self._job(record)

    def _job(self, record: JobRecord) -> JobSpec:
        """The record's spec from the registry, checked against the digest it was queued
        with; a row of a queue.db from before (its spec in the row) is registered first."""
        store = self._object_store()
        if record.spec_sha256 is None:
            if record.legacy_spec is None:
                raise ValueError(f"job {record.job_id}: the queue holds neither its spec nor "
                                 "its digest")
            digest = self._register(parse_job(record.legacy_spec,
                                              source=f"job {record.job_id} (queue.db)"))
            record = self.store.update(record.job_id, spec_sha256=digest)
        return registered_job(store, record.job_id, sha256=record.spec_sha256)

    def _event(self, job_id: str, kind: str, *, by: Principal, **detail) -> None:
        who = "admin" if by.is_admin else f"tenant {by.tenant}"
        self.store.add_event(job_id, kind, {"by": who, **detail}, at=self.clock())

    def _launch(self, record: JobRecord) -> None:
        runs = self._runs(record.job_id)
        if runs and not runs[-1].ended:  # a run this queue row never heard of: keep it
            return self._adopt(record, runs[-1], why="already running when admitted")
        job = self._job(record)
        try:
            if runs or record.resume_checkpoint:
                run_id = self.orchestrator.resume(job, checkpoint=record.resume_checkpoint)
            else:
                run_id = self.orchestrator.submit(job)
        except Exception as e:
            # The orchestrator's records decide: a run that started before the error (a
            # response lost after the submission) is the job's run, holding its GPUs.
            runs = self._runs(record.job_id)
            if runs and not runs[-1].ended:
                return self._adopt(record, runs[-1], why=f"started despite: {e}")
            log.warning("job %s could not be launched: %s", record.job_id, e)
            self.policy.release(record.job_id)
            self.store.update(record.job_id, queue_state="done")
            self.store.add_event(record.job_id, "launch_failed", {"reason": str(e)}, at=self.clock())
            return
        failpoint("api.after_run_submitted")  # the run exists, the queue row says queued
        self.store.update(record.job_id, queue_state="admitted", resume_checkpoint=None,
                          stop_requested=None)
        self.store.add_event(record.job_id, "admitted", {"run_id": run_id}, at=self.clock())
        log.info("job %s admitted: run %s", record.job_id, run_id)

    def _adopt(self, record: JobRecord, run: RunInfo, *, why: str) -> None:
        """Count a run the orchestrator reports as the job's own (it holds the job's GPUs)
        whatever the queue row said: admitted, not launched a second time."""
        self.store.update(record.job_id, queue_state="admitted", resume_checkpoint=None,
                          stop_requested=None)
        self.store.add_event(record.job_id, "admitted", {"run_id": run.run_id, "adopted": why},
                             at=self.clock())
        log.info("job %s admitted: its run %s was already active (%s)", record.job_id,
                 run.run_id, why)

    def _run_ended(self, record: JobRecord, run: RunInfo) -> None:
        wanted = record.stop_requested
        if record.job_id in self.stranded:  # not the policy's: it frees what it held
            self.policy.release_outside(record.job_id)
            self.store.update(record.job_id, queue_state="done", stop_requested=None)
            return
        if wanted == "restart" or (run.state == "preempted" and wanted != "cancel"):
            self.policy.requeue(record.job_id)
            self.store.update(record.job_id, queue_state="queued", stop_requested=None)
            self.store.add_event(record.job_id, "requeued", {"run_id": run.run_id}, at=self.clock())
            return
        self.policy.release(record.job_id)
        fields = {"queue_state": "done", "stop_requested": None}
        if wanted == "cancel":
            fields["cancelled_at"] = self.clock()
        self.store.update(record.job_id, **fields)

    def _status(self, record: JobRecord, runs: list[RunInfo] | None = None) -> str:
        runs = self._runs(record.job_id) if runs is None else runs
        last = runs[-1] if runs else None
        if record.queue_state == "queued":
            return "restarting" if runs else "queued"
        if record.queue_state == "admitted":
            if record.stop_requested == "preempt":
                return "preempting"
            if record.stop_requested == "cancel":
                return "cancelling"
            if record.stop_requested == "restart" or (last and last.state == "preempted"):
                return "restarting"
            if last is None or not last.ended:
                return "running"
            return last.state
        if record.cancelled_at is not None:
            return "cancelled"
        if last is None or last.state == "preempted":
            return "failed"  # never launched, or stopped without a way back
        return last.state

    def _failure_reason(self, record: JobRecord, runs: list[RunInfo], status: str) -> str | None:
        if status != "failed":
            return None
        if runs and runs[-1].reason:
            return runs[-1].reason
        for event in reversed(self.store.events(record.job_id)):
            if event["kind"] == "launch_failed":
                return event["detail"].get("reason")
        return None

    def _assemble(self, record: JobRecord) -> dict:
        runs = self._runs(record.job_id)
        status = self._status(record, runs)
        now = self.clock()
        held_s = sum(((r.ended_at or now) - r.started_at) for r in runs)
        gpu_hours = held_s * record.gpus / 3600.0
        job = self._job(record)
        metrics = progress.latest_metrics(self.site.runs_dir(record.job_id))
        seen = progress.checkpoints(record.job_id, self._object_store(),
                                    root=self.site.checkpoints_dir(record.job_id))
        last = progress.last_committed(seen)
        step = metrics.get("step", last.step if last else None)
        events = progress.job_events(self.site.runs_dir(record.job_id))
        held_by_kueue = progress.kueue_hold(events)
        if status == "running" and held_by_kueue:
            status = "queued"  # its segment waits in Kueue: admitted by the API only
        return {
            "job_id": record.job_id, "tenant": record.tenant, "status": status,
            "priority": record.priority, "model": record.request["model"], "gpus": record.gpus,
            "submitted_at": record.submitted_at,
            "queue_position": self.policy.queue_position(record.job_id),
            "step": step, "target_step": job.training.steps,
            "mfu": _number(metrics.get("mfu")),
            "step_time_ms": _step_time_ms(metrics),
            "tokens_per_s": _number(metrics.get("tokens_per_s")),
            "goodput": _goodput(self.site.runs_dir(record.job_id), held_s),
            "last_ckpt": last.location if last else None,
            "last_ckpt_step": last.step if last else None,
            "failure_reason": self._failure_reason(record, runs, status),
            "gpu_hours": round(gpu_hours, 6),
            "cost_usd": round(gpu_hours * job.cluster.price_per_gpu_hour, 4),
            "queued_by": held_by_kueue if status == "queued" else None,
            "preemptions": sum(e["kind"] == "preempted" for e in self.store.events(record.job_id))
            + sum(e["kind"] == "kueue_evicted" for e in events),
            "inplace_restarts": sum(e["kind"] == "inplace_restart" for e in events),
            "runs": len(runs),
            "router": _router(metrics),
        }

    def _checkpoint_location(self, job_id: str, wanted: str) -> str | None:
        committed = [c for c in progress.checkpoints(job_id, self._object_store(),
                                                     root=self.site.checkpoints_dir(job_id))
                     if c.committed]
        named = [c for c in committed if wanted in (c.location, f"step-{c.step:08d}", str(c.step))]
        if named and all(c.invalid for c in named):  # every copy of it was found corrupt
            raise FieldError([("checkpoint", (
                f"{wanted!r} is marked invalid ({named[0].invalid}); name another checkpoint "
                "or omit checkpoint for the newest valid one"))])
        for c in committed:
            if c.invalid:
                continue
            if wanted in (c.location, f"step-{c.step:08d}", str(c.step)):
                return c.location
        # One name per step, newest first (a step is listed once per tier that holds it).
        known = ", ".join(f"step-{step:08d}" for step in sorted(
            {c.step for c in committed}, reverse=True)) or "none yet"
        raise FieldError([("checkpoint", (
            f"{wanted!r} is not a committed checkpoint of job {job_id} (committed: {known})"
        ))])


    def _pin(self, job_id: str, location: str) -> None:
        from fm_pipeline.catalog import write_mark
        from fm_pipeline.catalog.validate import candidates

        for ref in candidates(job_id, store=self._object_store(),
                              root=self.site.checkpoints_dir(job_id)):
            if ref.location == location:
                write_mark(ref, "pin", {"reason": "a resume from this checkpoint was requested"})


def stranded_report(store: JobStore, stranded: dict[str, str]) -> str:
    """What `fm api serve` says at start about jobs its tenants config cannot schedule."""
    lines = [f"{len(stranded)} job(s) in the queue that these tenants cannot schedule "
             "(the others are served):"]
    tenants = set()
    for job_id, why in stranded.items():
        record = store.get(job_id)
        tenants.add(record.tenant)
        held = (f"running, its {record.gpus} GPUs counted against the pool until it ends"
                if record.queue_state == "admitted" else "queued")
        lines.append(f"  {job_id} (tenant {record.tenant}, {record.gpus} GPUs, {held}): {why}")
    for tenant in sorted(tenants):
        lines.append(f"  `fm api queue drain --tenant {tenant}` cancels its queued jobs; or "
                     f"add tenant {tenant} back to the tenants file")
    return "\n".join(lines)


def critique_of(job) -> list[dict]:
    """The planner's findings on a job for a GPU pool; none on CPUs, where planning would
    measure this machine (a matmul probe) inside the control plane."""
    if job.cluster.accelerator.lower() == "cpu":
        return []
    from fm_pipeline.planner.job_plan import job_critique

    return [f.to_dict() for f in job_critique(job)]


def _router(metrics: dict) -> dict | None:
    """The latest step's MoE routing (fm_pipeline.train.trainer's moe_* keys), if any."""
    if "moe_slots" not in metrics:
        return None
    return {"max_load": _number(metrics.get("moe_max_load")),
            "dropped_slots": int(metrics.get("moe_dropped_slots") or 0),
            "slots": int(metrics["moe_slots"])}


def _body_digest(body: JobCreate) -> str:
    import hashlib
    import json

    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _request(record: JobRecord) -> JobRequest:
    return JobRequest.gpus(record.job_id, record.tenant, record.gpus,
                           priority=PRIORITY_VALUES[record.priority], seq=record.seq)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _step_time_ms(metrics: dict) -> float | None:
    seconds = _number(metrics.get("step_time_s"))
    return round(seconds * 1000.0, 3) if seconds is not None else None


def _goodput(runs, held_s: float) -> float | None:
    """Fraction of the GPU time held that went into steps that count (None before any)."""
    if held_s <= 0:
        return None
    return round(min(1.0, progress.productive_seconds(runs) / held_s), 6)
