"""Stopping a segment that runs as a JobSet, from any process of this machine.

    with followed_jobset(runs, rendered) as record:   # after submit; removed at the end
        followed = client.follow(rendered.name, rendered.namespace, ...)
    stopped = record.stop_reason()                        # "preempt", "cancel" or None

    stop_jobsets(client, runs, reason="preempt")       # the control plane, meanwhile

The launcher that follows a JobSet leaves a record of it under
<the job's run directory>/jobsets/<namespace>.<name>.json (as a local launch leaves its segment
directory); a stop deletes each recorded JobSet gracefully (JobSetClient.stop) and writes
its reason into the record, once. The follower keeps following until the pods are gone,
then reads the reason back to say why the JobSet ended.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fm_pipeline.launch.jobset import RenderedSegment

if TYPE_CHECKING:
    from fm_pipeline.launch.k8s_client import JobSetClient


@dataclass(frozen=True)
class JobSetRecord:
    path: Path

    def read(self) -> dict:
        return json.loads(self.path.read_text())

    def stop_reason(self) -> str | None:
        try:
            return (self.read().get("stop") or {}).get("reason")
        except FileNotFoundError:
            return None

    def write(self, data: dict) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.path)  # a reader never sees half a record


def jobsets_dir(runs: Path) -> Path:
    return Path(runs) / "jobsets"


def pod_grace_period_s(rendered: RenderedSegment) -> int:
    """The pods' terminationGracePeriodSeconds (preStop wait + SIGTERM margin)."""
    pod = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return math.ceil(pod.get("terminationGracePeriodSeconds", 30))


@contextmanager
def followed_jobset(runs: Path, rendered: RenderedSegment) -> Iterator[JobSetRecord]:
    """Record a submitted JobSet in the job's run directory `runs` while its launcher
    follows it."""
    directory = jobsets_dir(runs)
    directory.mkdir(parents=True, exist_ok=True)
    record = JobSetRecord(directory / f"{rendered.namespace}.{rendered.name}.json")
    record.write({"name": rendered.name, "namespace": rendered.namespace,
                  "grace_period_s": pod_grace_period_s(rendered), "stop": None})
    try:
        yield record
    finally:
        record.path.unlink(missing_ok=True)


def followed_jobsets(runs: Path) -> list[JobSetRecord]:
    directory = jobsets_dir(runs)
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return [JobSetRecord(p) for p in paths]


def stop_jobsets(client: JobSetClient, runs: Path, *, reason: str) -> list[str]:
    """Delete every followed JobSet of the job not yet asked to stop (gracefully: the pods
    get their preStop hook and grace period); returns their names. Calling it again is
    cheap: a JobSet is deleted once."""
    stopped = []
    for record in followed_jobsets(runs):
        try:
            data = record.read()
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # its follower just finished
        if data.get("stop"):
            continue
        # The reason first: the follower may read it as soon as the JobSet is gone.
        record.write({**data, "stop": {"reason": reason, "at": time.time()}})
        try:
            client.stop(data["name"], data["namespace"], grace_period_s=data["grace_period_s"])
        except BaseException:
            record.write(data)  # not stopped: the next call tries again
            raise
        stopped.append(data["name"])
    return stopped
