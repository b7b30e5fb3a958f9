"""Training jobs the orchestrator knows: each job's spec, stored once under its name.

    register_job(store, job)            # jobs/<name>/spec.yaml in the object store
    job = registered_job(store, "demo") # what every segment, evaluation and drill reads
                                        # (parsed once per process and stored spec)
    registered_jobs(store)              # ["demo", ...]
    plan = job_plan(store, job)         # jobs/<name>/plan.json: planned once per spec

A Dagster partition of the training assets is a job name; this is where its spec lives,
in the store every process (Dagster steps, sensors, pods, the API) already shares.
Registering the same spec again is a no-op; a different spec under a name that exists is
refused (its checkpoints were written for the old one) unless `replace=True`.
"""

from __future__ import annotations

import hashlib
import json

from fm_pipeline.config import JobSpec, dump_job, parse_job
from fm_pipeline.config.strict_yaml import dump_yaml, load_yaml
from fm_pipeline.storage import ObjectNotFound, ObjectStore

PREFIX = "jobs"


def spec_key(name: str) -> str:
    return f"{PREFIX}/{name}/spec.yaml"


class UnknownJob(ValueError):
    """No job of that name was registered."""


# (store, name) -> (sha256 of the stored spec, the spec parsed): a process parses each
# registered spec once, however many sensors, segments and requests read it (JobSpec is frozen).
_parsed: dict[tuple[str, str], tuple[str, JobSpec]] = {}


def registered_job(store: ObjectStore, name: str, *, sha256: str | None = None) -> JobSpec:
    """The job's registered spec, parsed once per process; `sha256`: the digest a caller
    kept (the API's queue row), refused when the stored spec is no longer that one."""
    source = store.uri_of(spec_key(name))
    try:
        raw = store.get_bytes(spec_key(name))
    except (ObjectNotFound, FileNotFoundError):
        known = ", ".join(registered_jobs(store)) or "none"
        raise UnknownJob(f"training job {name!r} is not registered in {store.uri} "
                         f"(registered: {known})") from None
    digest = hashlib.sha256(raw).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ValueError(f"the registered spec of training job {name!r} ({source}) changed "
                         f"since it was queued (sha256 {digest[:12]}..., the queue kept "
                         f"{sha256[:12]}...): not started on a spec it was not admitted with")
    cached = _parsed.get((store.uri, name))
    if cached is not None and cached[0] == digest:
        return cached[1]
    job = parse_job(load_yaml(raw.decode("utf-8"), source=source), source=source)
    _parsed[(store.uri, name)] = (digest, job)
    return job


def registered_digest(store: ObjectStore, name: str) -> str:
    """sha256 of the job's stored spec: what a queue row keeps instead of the spec."""
    try:
        return hashlib.sha256(store.get_bytes(spec_key(name))).hexdigest()
    except (ObjectNotFound, FileNotFoundError):
        raise ValueError(f"no training job {name!r} is registered in {store.uri}") from None


def registered_jobs(store: ObjectStore) -> list[str]:
    names = {info.key.split("/")[1] for info in store.list(f"{PREFIX}/")
             if info.key.endswith("/spec.yaml")}
    return sorted(names)


def register_job(store: ObjectStore, job: JobSpec, *, replace: bool = False) -> str:
    """Store the spec under the job's name; returns its location."""
    key = spec_key(job.name)
    if store.exists(key) and not replace:
        existing = dump_job(registered_job(store, job.name))
        wanted = dump_job(job)
        if existing == wanted:
            return store.uri_of(key)
        differ = sorted(_differences(existing, wanted))
        raise ValueError(f"training job {job.name!r} is already registered with another spec "
                         f"(differs in {', '.join(differ[:8])}); choose a new name or "
                         "register with replace=True")
    raw = dump_yaml(dump_job(job)).encode()
    store.put_bytes(raw, key)
    # What was stored parses back to `job` (dump_job's contract): the registering process
    # does not parse it again.
    _parsed[(store.uri, job.name)] = (hashlib.sha256(raw).hexdigest(), job)
    return store.uri_of(key)


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}")
    return out


def plan_key(name: str) -> str:
    return f"{PREFIX}/{name}/plan.json"


def _spec_digest(job: JobSpec) -> str:
    return hashlib.sha256(json.dumps(dump_job(job), sort_keys=True).encode()).hexdigest()


def job_plan(store: ObjectStore, job: JobSpec) -> dict | None:
    """The planner's plan of `job` (planner.job_plan.plan_for_job), computed once per spec and
    kept beside it (the CPU's matmul probe alone costs a second per process); None for a
    layout the planner cannot model. Every process of the job reads the same plan."""
    from fm_pipeline.planner.job_plan import PLAN_VERSION, plan_for_job

    digest = _spec_digest(job)
    try:
        stored = json.loads(store.get_bytes(plan_key(job.name)))
        # A plan of this spec by this planner version (older plans lack newer sections).
        if stored.get("spec_sha256") == digest and stored.get("version") == PLAN_VERSION:
            return stored.get("plan")
    except (ObjectNotFound, FileNotFoundError, ValueError):
        pass
    try:
        plan = plan_for_job(job)
    except ValueError:  # a layout the planner cannot model: segments run without a plan
        plan = None
    store.put_bytes(json.dumps({"spec_sha256": digest, "version": PLAN_VERSION, "plan": plan},
                               indent=1).encode(), plan_key(job.name))
    return plan


def fault_key(name: str) -> str:
    return f"{PREFIX}/{name}/fault.json"


def plant_fault(store: ObjectStore, job_name: str, fail_at: str) -> None:
    """Chaos for demos and drills: the first segment of the job whose steps contain STEP of
    `fail_at` ("RANK:STEP") runs with that fault (FM_FAULT_FAIL_AT); then it is spent."""
    rank, sep, step = fail_at.partition(":")
    if not sep or not rank.strip().isdigit() or not step.strip().isdigit():
        raise ValueError(f"fail_at {fail_at!r}: expected RANK:STEP, e.g. 1:35")
    store.put_bytes(json.dumps({"fail_at": fail_at, "spent": False}).encode(),
                    fault_key(job_name))


def take_fault(store: ObjectStore, job_name: str, *, start: int, end: int) -> str:
    """The planted fault ("RANK:STEP") if this segment's steps (start, end] contain it, and
    mark it spent (a conditional write: one segment takes it); "" otherwise."""
    from fm_pipeline.storage import PreconditionFailed

    try:
        data, etag = store.get_with_etag(fault_key(job_name))
    except (ObjectNotFound, FileNotFoundError):
        return ""
    fault = json.loads(data)
    step = int(fault["fail_at"].split(":")[1])
    if fault.get("spent") or not start <= step < end:
        return ""
    try:
        store.put_if(json.dumps({**fault, "spent": True}).encode(), fault_key(job_name),
                     etag=etag)
    except PreconditionFailed:
        return ""
    return fault["fail_at"]
