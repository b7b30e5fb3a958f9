"""Training jobs the orchestrator knows: each job's spec, stored once under its name.

    register_job(store, job)            # jobs/<name>/spec.yaml in the object store
    job = registered_job(store, "demo") # what every segment, evaluation and drill reads
    registered_jobs(store)              # ["demo", ...]

A Dagster partition of the training assets is a job name; this is where its spec lives,
in the store every process (Dagster steps, sensors, pods, the API) already shares.
Registering the same spec again is a no-op; a different spec under a name that exists is
refused (its checkpoints were written for the old one) unless `replace=True`.
"""

from __future__ import annotations

from fm_pipeline.config import JobSpec, dump_job, parse_job
from fm_pipeline.config.strict_yaml import dump_yaml, load_yaml
from fm_pipeline.storage import ObjectNotFound, ObjectStore

PREFIX = "jobs"


def spec_key(name: str) -> str:
    return f"{PREFIX}/{name}/spec.yaml"


class UnknownJob(ValueError):
    """No job of that name was registered."""


def registered_job(store: ObjectStore, name: str) -> JobSpec:
    try:
        data = load_yaml(store.get_bytes(spec_key(name)).decode("utf-8"),
                         source=store.uri_of(spec_key(name)))
    except (ObjectNotFound, FileNotFoundError):
        known = ", ".join(registered_jobs(store)) or "none"
        raise UnknownJob(f"training job {name!r} is not registered in {store.uri} "
                         f"(registered: {known})") from None
    return parse_job(data, source=store.uri_of(spec_key(name)))


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
    store.put_bytes(dump_yaml(dump_job(job)).encode(), key)
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
