"""Training runs asked for, waiting for the Dagster daemon to start them.

    number = submit_run(store, job, tags={"fm/api_job_id": "job-1"})     # 1, 2, ... per job
    submit_run(store, job, kind="data_mix")     # prepare the job's data mix (fm demo)
    submit_run(store, job, kind="drill")        # drill its newest checkpoint now
    for s in submissions(store, after=cursor): ...                         # the intake sensor
    request_stop(store, "job-1", 2, "cancel"); stop_of(store, "job-1", 2)    # Stop | None
    reject(store, "job-1", 2, "resume_from ... is not a checkpoint")       # the intake says why

A control plane (the REST API, `fm demo`, a script) never executes a run itself: it records
what it wants in the store every process of the deployment shares (`jobs/<name>/runs/
<number>.json`, created with a conditional write so two control planes cannot take one
number), and the daemon's intake sensor turns each record into a run keyed
`<kind>-<name>-<number>`: whatever evaluates it again, the run starts once. A "train"
submission starts the job's first segment, and the failure and progress sensors carry the
job from there to its target step; "data_mix" prepares the job's data mix; "drill" drills
its newest checkpoint without waiting for the drill schedule.

A control plane that stops a training run (preempt, cancel) records that beside the
submission (`train-<number>.stop.json`) before it terminates the run: every process then
agrees, a run not started yet never starts (the intake and the segment asset refuse it), the
sensors neither resume it nor start its next segment. A submission the intake cannot start
(an unknown checkpoint, nothing left to train) gets `train-<number>.rejected.json` with the
reason, which the API shows as the run's state.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field

from fm_pipeline.orchestration.registry import PREFIX
from fm_pipeline.storage import ObjectNotFound, ObjectStore, PreconditionFailed

KINDS = ("train", "data_mix", "drill")
STOPS = ("preempt", "cancel")  # cancel outranks preempt: a cancelled run stays cancelled
_SUBMISSION = re.compile(r"^[a-z_]+-\d{6}\.json$")


@dataclass(frozen=True)
class Submission:
    job: str
    number: int
    at: float  # unix seconds
    kind: str = "train"
    tags: dict[str, str] = field(default_factory=dict)
    resume_from: str = ""  # a committed checkpoint to start from (a rollback); "": newest
    fail_at: str = ""  # RANK:STEP fault injection for the first segment (demo, drills)

    @property
    def run_key(self) -> str:
        return f"{'run' if self.kind == 'train' else self.kind}-{self.job}-{self.number}"


def _key(job: str, kind: str, number: int) -> str:
    return f"{PREFIX}/{job}/runs/{kind}-{number:06d}.json"


def submit_run(store: ObjectStore, job, *, kind: str = "train",
               tags: dict[str, str] | None = None, resume_from: str = "",
               fail_at: str = "") -> Submission:
    """Record a run of `job` (registered already) for the daemon; the next free number (one
    sequence per job and kind: a job's training runs are numbered 1, 2, ...)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    taken = [s.number for s in job_submissions(store, job.name) if s.kind == kind]
    number = max(taken, default=0) + 1
    while True:
        submission = Submission(job=job.name, number=number, at=time.time(), kind=kind,
                                tags=dict(tags or {}), resume_from=resume_from,
                                fail_at=fail_at)
        body = (json.dumps(asdict(submission), indent=1) + "\n").encode()
        try:
            store.put_if(body, _key(job.name, kind, number), etag=None)
            return submission
        except PreconditionFailed:  # another control plane took this number: the next
            number += 1


def job_submissions(store: ObjectStore, job_name: str) -> list[Submission]:
    out = []
    for info in store.list(f"{PREFIX}/{job_name}/runs/"):
        if _SUBMISSION.fullmatch(info.key.rsplit("/", 1)[-1]):
            out.append(Submission(**json.loads(store.get_bytes(info.key))))
    return sorted(out, key=lambda s: s.number)


def submissions(store: ObjectStore, *, after: float = 0.0) -> list[Submission]:
    """Every job's submissions recorded after unix time `after`, oldest first."""
    out = []
    for info in store.list(f"{PREFIX}/"):
        parts = info.key.split("/")
        if len(parts) == 4 and parts[2] == "runs" and _SUBMISSION.fullmatch(parts[3]):
            sub = Submission(**json.loads(store.get_bytes(info.key)))
            if sub.at > after:
                out.append(sub)
    return sorted(out, key=lambda s: (s.at, s.job, s.number))


@dataclass(frozen=True)
class Stop:
    how: str  # "preempt" | "cancel"
    at: float


def _marker(job: str, number: int, what: str) -> str:
    return f"{PREFIX}/{job}/runs/train-{number:06d}.{what}.json"


def request_stop(store: ObjectStore, job: str, number: int, how: str) -> Stop:
    """Record that training run `number` of `job` is to stop (`how`: preempt | cancel);
    returns the stop in force (a cancel is never downgraded to a preemption)."""
    if how not in STOPS:
        raise ValueError(f"a stop is one of {STOPS}, got {how!r}")
    key = _marker(job, number, "stop")
    while True:
        current, etag = None, None
        try:
            data, etag = store.get_with_etag(key)
            current = Stop(**json.loads(data))
        except ObjectNotFound:
            pass
        if current is not None and (current.how == how or current.how == "cancel"):
            return current
        stop = Stop(how=how, at=time.time())
        body = (json.dumps(asdict(stop)) + "\n").encode()
        try:
            store.put_if(body, key, etag=etag)
            return stop
        except PreconditionFailed:  # another control plane wrote one meanwhile: look again
            continue


def stop_of(store: ObjectStore, job: str, number: int) -> Stop | None:
    key = _marker(job, number, "stop")
    if not store.exists(key):
        return None
    return Stop(**json.loads(store.get_bytes(key)))


def reject(store: ObjectStore, job: str, number: int, reason: str) -> None:
    """The intake could not start training run `number`: say why, once."""
    body = (json.dumps({"reason": reason, "at": time.time()}) + "\n").encode()
    try:
        store.put_if(body, _marker(job, number, "rejected"), etag=None)
    except PreconditionFailed:
        pass


def rejection(store: ObjectStore, job: str, number: int) -> str | None:
    key = _marker(job, number, "rejected")
    if not store.exists(key):
        return None
    return json.loads(store.get_bytes(key))["reason"]
