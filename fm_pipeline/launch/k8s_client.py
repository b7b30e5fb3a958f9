"""Submit a rendered segment to Kubernetes, follow it to the end, delete it.

    client = JobSetClient.from_kubeconfig()                 # or JobSetClient.in_cluster()
    client.submit(rendered)                                  # JobSet, then its ConfigMap
    followed = client.follow(rendered.name, rendered.namespace,
                             on_leader_pod=lambda pod: print_logs(client, pod, ns))
    result = segment_result(followed, launch)                # k8s_follow: as locally
    client.delete(rendered.name, rendered.namespace)

`follow` polls the JobSet, and each time a new node-rank-0 pod (the leader: global rank 0,
the one that speaks Dagster Pipes) is running it calls `on_leader_pod` with its name; that
call reads the pod's logs until the pod ends. A JobSet restart brings a new leader pod, so
the reader re-attaches. Terminated containers' exit codes and termination messages are
collected on the way: they are the failure evidence once the JobSet is over.

Kueue preempts by suspending the JobSet again (its Workload evicted): the JobSet controller
suspends the Jobs, their pods are deleted with their grace period (preStop: the trainer
checkpoints and exits 75). A JobSet seen admitted and then suspended is followed until its
pods have ended and reported `Evicted`; the segment ends preempted, the launcher deletes
the JobSet, and the next segment queues again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from fm_pipeline.launch.jobset import JOBSET_API, JOBSET_NAME_LABEL, RenderedSegment
from fm_pipeline.launch.k8s_follow import (
    RESTART_ATTEMPT_LABEL,
    FollowResult,
    JobSetStatus,
    PodFailureWatch,
    jobset_status,
)

GROUP, VERSION = JOBSET_API.split("/")
PLURAL = "jobsets"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


class JobSetExists(ValueError):
    """A JobSet of that name is already there (a segment is running, or was not deleted)."""


class SegmentTimeout(TimeoutError):
    pass


class JobSetClient:
    def __init__(self, api_client):
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def from_kubeconfig(cls, config_file: str | None = None, context: str | None = None):
        from kubernetes import config

        return cls(config.new_client_from_config(config_file=config_file, context=context))

    @classmethod
    def in_cluster(cls):
        from kubernetes import client, config

        config.load_incluster_config()
        return cls(client.ApiClient())

    # -- submit / delete --------------------------------------------------------------------

    def submit(self, rendered: RenderedSegment) -> dict:
        """Create the JobSet, then its ConfigMap owned by it (deleted with it). Nothing is
        left behind if any create fails. The headless Service is the JobSet controller's
        (created from spec.network, owned by the JobSet)."""
        from kubernetes.client.exceptions import ApiException

        ns = rendered.namespace
        try:
            jobset = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, rendered.jobset, field_validation="Strict")
        except ApiException as e:
            if e.status == 409:
                raise JobSetExists(
                    f"JobSet {rendered.name!r} already exists in namespace {ns!r}: delete it "
                    "(or wait for it) before launching this segment again") from None
            raise
        owner = {"apiVersion": JOBSET_API, "kind": "JobSet", "name": rendered.name,
                 "uid": jobset["metadata"]["uid"], "controller": False,
                 "blockOwnerDeletion": False}
        try:
            obj = rendered.config_map
            body = {**obj, "metadata": {**obj["metadata"], "ownerReferences": [owner]}}
            self.core.create_namespaced_config_map(ns, body, field_validation="Strict")
        except BaseException:
            self.delete(rendered.name, ns)
            raise
        if rendered.keeper is not None:
            self.ensure_keeper(rendered.keeper)
        return jobset

    def ensure_keeper(self, daemonset: dict) -> bool:
        """Create the fast tier's node keeper unless the namespace has it (every job there
        shares it, and outlives each): True if created."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.apps.create_namespaced_daemon_set(daemonset["metadata"]["namespace"],
                                                   daemonset, field_validation="Strict")
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete(self, name: str, namespace: str) -> bool:
        """Delete the JobSet (foreground: its Jobs, pods and the controller's Service first)
        and its ConfigMap. Returns False if there was no JobSet."""
        from kubernetes.client import V1DeleteOptions
        from kubernetes.client.exceptions import ApiException

        existed = True
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name,
                body=V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as e:
            if e.status != 404:
                raise
            existed = False
        # Its owner reference makes it go too; deleting it here does not depend on the GC.
        try:
            self.core.delete_namespaced_config_map(f"{name}-job", namespace)
        except ApiException as e:
            if e.status != 404:
                raise
        return existed

    def stop(self, name: str, namespace: str, *, grace_period_s: int) -> bool:
        """Preempt a running segment: delete only the JobSet, in the foreground. Its pods
        then end as on any preemption (preStop touches the trainer's flag, SIGTERM follows,
        SIGKILL after terminationGracePeriodSeconds), the JobSet stays (Stopping) until they
        are gone, so a follower still reads the leader's log and exit, and the next JobSet
        of that name cannot start beside a stale rank (as BlockingRecreate). The ConfigMap
        and the controller's Service go with it (owner references) or with `delete` after
        the follow.
        False if there was no JobSet."""
        from kubernetes.client import V1DeleteOptions
        from kubernetes.client.exceptions import ApiException

        try:
            # The garbage collector deletes the pods with their own terminationGracePeriod-
            # Seconds; `grace_period_s` says the same for anything that honours it.
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body=V1DeleteOptions(
                    propagation_policy="Foreground", grace_period_seconds=grace_period_s))
        except ApiException as e:
            if e.status != 404:
                raise
            return False
        return True

    # -- observe ----------------------------------------------------------------------------

    def get(self, name: str, namespace: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def status(self, name: str, namespace: str) -> JobSetStatus:
        return jobset_status(self.get(name, namespace), name)

    def queue_reason(self, name: str, namespace: str) -> str | None:
        """Why Kueue has not admitted the JobSet, as its Workload says (a LocalQueue that
        does not exist, quota, topology); None without a Workload (yet) or without Kueue."""
        workload = self.workload(name, namespace) or {}
        for condition in (workload.get("status") or {}).get("conditions") or []:
            if condition["type"] == "QuotaReserved" and condition["status"] == "False":
                return condition.get("message") or condition.get("reason")
        return None

    def workload(self, name: str, namespace: str) -> dict | None:
        """The Kueue Workload of the JobSet (None without one, or without Kueue)."""
        from kubernetes.client.exceptions import ApiException

        try:
            workloads = self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads")["items"]
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        for workload in workloads:
            owners = workload["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == "JobSet" and o.get("name") == name for o in owners):
                return workload
        return None

    def eviction(self, name: str, namespace: str) -> dict | None:
        """Why and when Kueue evicted the JobSet's Workload (its Evicted condition), as
        {reason, message, evicted_at}; None if it was not evicted."""
        from fm_pipeline.launch.k8s_kueue_events import condition_time

        workload = self.workload(name, namespace) or {}
        for condition in (workload.get("status") or {}).get("conditions") or []:
            if condition["type"] == "Evicted" and condition["status"] == "True":
                return {"reason": condition.get("reason"), "message": condition.get("message"),
                        "evicted_at": condition_time(condition.get("lastTransitionTime"))}
        return None

    def pods(self, name: str, namespace: str, *, node_rank: int | None = None) -> list:
        selector = f"{JOBSET_NAME_LABEL}={name}"
        if node_rank is not None:
            selector += f",{COMPLETION_INDEX_LABEL}={node_rank}"
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def leader_pod(self, name: str, namespace: str):
        """Node rank 0 of the newest restart attempt (None before the pods exist)."""
        pods = [p for p in self.pods(name, namespace, node_rank=0)
                if p.metadata.deletion_timestamp is None]
        if not pods:
            return None

        def newest(pod):
            attempt = int((pod.metadata.labels or {}).get(RESTART_ATTEMPT_LABEL, 0))
            created = pod.metadata.creation_timestamp
            return attempt, created.timestamp() if created else 0.0

        return max(pods, key=newest)

    def log_lines(self, pod: str, namespace: str, *, follow: bool = True) -> Iterator[str]:
        """The pod's log, line by line, following it until the container ends."""
        response = self.core.read_namespaced_pod_log(pod, namespace, follow=follow,
                                                     _preload_content=False)
        pending = b""
        try:
            for chunk in response.stream(amt=4096, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            response.release_conn()

    def _evicted(self, status: JobSetStatus, namespace: str) -> JobSetStatus:
        """Suspended after admission: Evicted once no pod of it is left running."""
        live = [p for p in self.pods(status.name, namespace)
                if not (p.status and p.status.phase in ("Succeeded", "Failed"))]
        if live:
            return JobSetStatus(status.name, "Suspended", status.restarts,
                                f"suspended after admission (Kueue preempted it); "
                                f"{len(live)} pod(s) still ending")
        return JobSetStatus(status.name, "Evicted", status.restarts,
                            "suspended again after admission: Kueue preempted (evicted) the "
                            "workload and its pods have ended")

    def follow(
        self,
        name: str,
        namespace: str,
        *,
        on_leader_pod: Callable[[str], None] | None = None,
        on_status: Callable[[JobSetStatus], None] | None = None,
        poll_s: float = 5.0,
        timeout_s: float | None = None,
    ) -> FollowResult:
        """Block until the JobSet completes, fails or disappears (see the module docstring)."""
        started = time.monotonic()
        attached: list[str] = []
        watch = PodFailureWatch(self, name, namespace)
        watch.start()
        last_phase = None
        admitted = False
        try:
            while True:
                status = self.status(name, namespace)
                if status.phase == "Suspended" and admitted:
                    status = self._evicted(status, namespace)
                admitted = admitted or status.phase in ("Pending", "Running")
                if status.phase == "Suspended" and not admitted:
                    reason = self.queue_reason(name, namespace)
                    if reason:
                        status = JobSetStatus(name, "Suspended", status.restarts,
                                              f"queued, not admitted by Kueue: {reason}")
                if on_status and (status.phase, status.restarts, status.message) != last_phase:
                    on_status(status)
                    last_phase = (status.phase, status.restarts, status.message)
                if status.terminal:
                    break
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    raise SegmentTimeout(
                        f"JobSet {name} still {status.phase} after {timeout_s:g} s"
                        + (f": {status.message}" if status.message else ""))
                leader = self.leader_pod(name, namespace) if on_leader_pod else None
                phase = leader.status.phase if leader is not None and leader.status else None
                if leader is not None and leader.metadata.name not in attached and phase in (
                        "Running", "Succeeded", "Failed"):
                    # Reading the log blocks until it ends: say the status first, as it is
                    # now (the JobSet may have turned Running since the poll above).
                    status = self.status(name, namespace)
                    if on_status and (status.phase, status.restarts, status.message) != last_phase:
                        on_status(status)
                        last_phase = (status.phase, status.restarts, status.message)
                    attached.append(leader.metadata.name)
                    on_leader_pod(leader.metadata.name)  # returns when the pod's log ends
                    continue
                time.sleep(poll_s)
        finally:
            watch.stop()
        for pod in self.pods(name, namespace):  # anything the watch has not delivered yet
            watch.record(pod)
        return FollowResult(status=status, duration_s=time.monotonic() - started,
                            leader_pods=attached, failures=watch.failures())
