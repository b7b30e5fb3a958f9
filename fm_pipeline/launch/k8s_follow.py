"""Following a JobSet: the failure causes its pods leave, and the segment's result.

What a JobSet's status object says (jobset_status). A pod watch (PodFailureWatch) keeps every container that ended non-zero with its exit code
and termination message, before the JobSet controller deletes the pods to restart;
`segment_result` turns what `JobSetClient.follow` saw into the same SegmentResult the
local launcher gives.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from fm_pipeline.launch.jobset import JOBSET_NAME_LABEL
from fm_pipeline.launch.outcome import (
    FailureEvidence,
    Outcome,
    SegmentResult,
    outcome_of,
    parse_error_record,
    parse_torchrun_summary,
)
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.rundir.exit_codes import PREEMPTED

log = logging.getLogger(__name__)
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


class PodReader(Protocol):
    """What the pod watch needs of a client (JobSetClient): the core API."""

    core: Any  # kubernetes.client.CoreV1Api


@dataclass(frozen=True)
class PodFailure:
    pod: str
    container_exit_code: int  # torchrun's: 1 for any worker failure, 137 if killed
    evidence: FailureEvidence  # the worker's code and reason, when the message has them
    restart_attempt: int = 0
    finished_at: str = ""  # RFC 3339; the first pod to fail in an attempt is the cause

    def order(self) -> tuple:
        # Latest attempt last; within it the first to finish, then one whose message named
        # the failing rank (torchrun's summary or a worker record) over a bare exit code.
        return (-self.restart_attempt, self.finished_at, self.evidence.rank is None, self.pod)


@dataclass
class JobSetStatus:
    name: str
    # Pending, Suspended (queued by Kueue), Running, Stopping (deleted, its pods in their
    # grace period), Completed, Failed, Deleted; Evicted: suspended again after it had been
    # admitted (Kueue preempted it) and its pods have ended
    phase: str
    restarts: int = 0
    message: str = ""

    @property
    def terminal(self) -> bool:
        return self.phase in ("Completed", "Failed", "Deleted", "Evicted")


def jobset_status(obj: dict | None, name: str) -> JobSetStatus:
    if obj is None:
        return JobSetStatus(name, "Deleted", message="the JobSet no longer exists")
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if c.get("status") == "True"}
    restarts = int(status.get("restarts") or 0)
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return JobSetStatus(name, "Stopping", restarts,
                            "deleted; waiting for its pods to end their grace period")
    terminal = status.get("terminalState")
    for phase in ("Completed", "Failed"):
        if terminal == phase or phase in conditions:
            message = (conditions.get(phase) or {}).get("message", "")
            return JobSetStatus(name, phase, restarts, message)
    if "Suspended" in conditions or (obj.get("spec") or {}).get("suspend"):
        return JobSetStatus(name, "Suspended", restarts, "queued (suspended, e.g. by Kueue)")
    # A replicated job counts `ready` Jobs: every pod ready or done (jobset_controller.go,
    # calculateReplicatedJobStatuses); `active` also counts pods still pulling or scheduling.
    ready = sum(int(r.get("ready") or 0) for r in status.get("replicatedJobsStatus") or [])
    return JobSetStatus(name, "Running" if ready else "Pending", restarts)


@dataclass
class FollowResult:
    status: JobSetStatus
    duration_s: float
    leader_pods: list[str] = field(default_factory=list)
    failures: list[PodFailure] = field(default_factory=list)

    def root_failure(self) -> PodFailure | None:
        """The first pod to fail in the latest restart attempt."""
        return min(self.failures, key=PodFailure.order) if self.failures else None


class PodFailureWatch:
    """Watches the JobSet's pods and keeps every container that ended non-zero.

    A watch, not polling: on a failure the JobSet controller deletes all pods to restart,
    and the cause (exit code, termination message) goes with them unless it was seen.
    """

    # Each watch request ends after this long; stop() lets the current one finish and then
    # reads once more from the last resourceVersion, so events written between two requests
    # (the last pods' failures, just before the JobSet is seen failed) are not dropped.
    WINDOW_S = 2
    DRAIN_S = 1

    def __init__(self, client: PodReader, name: str, namespace: str):
        self.client = client
        self.namespace = namespace
        self.selector = f"{JOBSET_NAME_LABEL}={name}"
        self._failures: dict[tuple[str, str], PodFailure] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=self.WINDOW_S + self.DRAIN_S + 2)

    def failures(self) -> list[PodFailure]:
        with self._lock:
            return list(self._failures.values())

    def record(self, pod) -> None:
        statuses = (pod.status.container_statuses or []) if pod.status else []
        for cs in statuses:
            terminated = cs.state.terminated if cs.state else None
            key = (pod.metadata.name, cs.name)
            if terminated is None or terminated.exit_code == 0:
                continue
            with self._lock:
                if key in self._failures:
                    continue
                labels = pod.metadata.labels or {}
                finished = terminated.finished_at
                self._failures[key] = PodFailure(
                    pod=pod.metadata.name, container_exit_code=terminated.exit_code,
                    evidence=container_failure(pod.metadata.name, terminated.exit_code,
                                               terminated.message or "", terminated.reason),
                    restart_attempt=int(labels.get(RESTART_ATTEMPT_LABEL, 0)),
                    finished_at=finished.isoformat() if finished else "")

    def _list(self) -> str:
        """Records the current pods; returns the version to watch on from."""
        listed = self.client.core.list_namespaced_pod(self.namespace,
                                                      label_selector=self.selector)
        for pod in listed.items:
            self.record(pod)
        return listed.metadata.resource_version

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        resource_version = None
        while True:
            last = self._stopped.is_set()  # the drain: one more read, then done
            kwargs = {"label_selector": self.selector,
                      "timeout_seconds": self.DRAIN_S if last else self.WINDOW_S}
            try:
                if not resource_version:
                    # List, then watch from the list's own resourceVersion (client-go's
                    # reflector does the same): resuming from a pod's older version after a
                    # 410 would only be answered 410 again.
                    resource_version = self._list()
                kwargs["resource_version"] = resource_version
                for event in watch.Watch().stream(self.client.core.list_namespaced_pod,
                                                  self.namespace, **kwargs):
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version or resource_version
                    self.record(pod)
            except ApiException as e:
                if e.status == 410:  # too old: start again from the current state
                    resource_version = None
                    continue
                log.warning("pod watch for %s: %s", self.selector, e)
                if not last:
                    self._stopped.wait(1.0)
            except Exception as e:  # connection dropped: the next window reconnects
                log.warning("pod watch for %s: %s", self.selector, e)
                if not last:
                    self._stopped.wait(1.0)
            if last:
                return


def container_failure(pod: str, exit_code: int, message: str,
                      reason: str | None = None) -> FailureEvidence:
    """A terminated container: torchrun's exit code, and the worker's, if its message says."""
    source = f"pod {pod} termination message"
    evidence = (parse_error_record(message, source=source)
                or parse_torchrun_summary(message, source=source))
    if evidence is None:
        evidence = FailureEvidence(source, reason=last_error_line(message) or reason
                                   or "no termination message")
    if evidence.exit_code is None:
        # Only torchrun's own code is known; 137 = SIGKILL (e.g. OOMKilled, node lost).
        evidence = FailureEvidence(evidence.source, exit_code=exit_code,
                                   reason=evidence.reason or reason, rank=evidence.rank,
                                   traceback=evidence.traceback)
    return evidence


_EXCEPTION_LINE = re.compile(r"^\s*([\w.]+(?:Error|Exception|Interrupt)\b.*)$")


def last_error_line(text: str) -> str | None:
    """The last `SomethingError: ...` line of a log tail, else its last meaningful line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("=-")]
    for line in reversed(lines):
        match = _EXCEPTION_LINE.match(line)
        if match:
            return match.group(1)
    return lines[-1] if lines else None


def segment_result(followed: FollowResult, launch: SegmentLaunch, *,
                   stopped: str | None = None) -> SegmentResult:
    """The same SegmentResult the local launcher gives, from what `follow` saw. `stopped`:
    the reason the JobSet was deleted on request (k8s_stop), if it was."""
    status = followed.status
    common = dict(job=launch.job.name, end_step=launch.end_step,
                  duration_s=round(followed.duration_s, 3))
    if stopped and status.phase == "Deleted" and not followed.failures:
        # Deleted before any pod failed: queued, or its pods ended without a record.
        return SegmentResult(outcome=Outcome.PREEMPTED, exit_code=PREEMPTED, reason=(
            f"stopped on request ({stopped}): the JobSet was deleted before any pod reported "
            "an exit; the next segment resumes from the newest valid checkpoint"),
            torchrun_exit_code=PREEMPTED, evidence="JobSet deleted on request", **common)
    if status.phase == "Evicted":
        last = followed.root_failure()
        if last is None or last.evidence.exit_code in (PREEMPTED, None) or \
                outcome_of(last.evidence.exit_code) is Outcome.KILLED:
            # Its pods ended as any preemption ends them (exit 75 after a checkpoint, or
            # killed at the end of the grace period): the next segment resumes.
            detail = f"; {last.evidence.reason}" if last and last.evidence.reason else ""
            return SegmentResult(outcome=Outcome.PREEMPTED, exit_code=PREEMPTED, reason=(
                f"preempted by Kueue: {status.message}{detail}; the next segment queues "
                "again and resumes from the newest valid checkpoint"),
                torchrun_exit_code=last.container_exit_code if last else PREEMPTED,
                failed_rank=last.evidence.rank if last else None,
                evidence=last.evidence.source if last else "JobSet suspended by Kueue",
                **common)
    if status.phase == "Completed":
        return SegmentResult(outcome=Outcome.SUCCEEDED, exit_code=0, torchrun_exit_code=0,
                             reason=f"reached end step after {status.restarts} JobSet restart(s)",
                             **common)
    if not followed.failures:
        return SegmentResult(outcome=Outcome.FAILED, exit_code=1, torchrun_exit_code=1,
                             reason=f"JobSet {status.phase.lower()}: "
                                    f"{status.message or 'no pod failure recorded'}",
                             evidence="JobSet status", **common)
    last = followed.root_failure()
    root = last.evidence
    reason = root.reason or f"JobSet {status.phase.lower()}"
    if status.restarts:
        reason += f" (after {status.restarts} JobSet restart(s))"
    if stopped:
        reason += f"; the JobSet was deleted on request ({stopped})"
    return SegmentResult(outcome=outcome_of(root.exit_code), exit_code=root.exit_code,
                         reason=reason, torchrun_exit_code=last.container_exit_code,
                         failed_rank=root.rank, traceback=root.traceback,
                         evidence=root.source, **common)
