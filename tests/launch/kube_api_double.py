"""A TEST DOUBLE of the kube-apiserver with the controllers a segment meets, on 127.0.0.1.

No kube-apiserver can be installed here (no PyPI/npm/Debian package ships one), so the
client is tested against this: real HTTP, the kubernetes python client's real requests,
JSON shaped like the API server's, and behind it the Kueue webhook and admission, the
JobSet controller, the Job controller and the garbage collector, each following the real
one's source (kube_controllers.py, and docs/kubernetes.md for the citations). The test
plays the kubelet: it starts the pods the Job controller made (`start_pod`), writes their
logs, ends them (`terminate_pod`) and finishes the ones being deleted (`delete_pod`), or
lets `instant_kubelet` end a deleted running pod at once.

Endpoints: JobSet create/get/delete; ConfigMap, Service and DaemonSet create/delete; node
get (`add_node`); pod list and
watch by label selector; pod log (with follow: the response stays open until the pod
terminates). Every write takes the next revision as the object's resourceVersion (one
counter, as etcd's); a watch resumes after a resourceVersion, starts from the current pods
without one, and gets 410 Gone for one that `compact()` dropped.
Every request is recorded in `requests` as (method, path, query), every delete's options
in `delete_options` as (path, body).

Kueue: a JobSet with a queue-name label is created suspended; with `admission` set (a node
selector, default {}) it is admitted at once, else when the test calls `admit`; `preempt`
evicts it (suspended again, templates restored).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from tests.conftest import free_port
from tests.launch.kube_controllers import COMPLETION_INDEX, RESTARTS_LABEL, Controllers

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/"
DAEMONSETS = "/apis/apps/v1/namespaces/"  # stored only: no DaemonSet controller here
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
SIGTERM_EXIT = 143  # what a container stopped by SIGTERM reports


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeApiDouble:
    def __init__(self):
        self.lock = threading.Condition()
        self.jobsets: dict[tuple[str, str], dict] = {}
        self.jobs: dict[tuple[str, str], dict] = {}
        self.core: dict[tuple[str, str, str], dict] = {}  # (kind plural, ns, name)
        self.pods: dict[tuple[str, str], dict] = {}
        self.nodes: dict[str, dict] = {}  # name -> Node (add_node): read by the pods' ranks
        self.workloads: dict[tuple[str, str], dict] = {}  # Kueue's, per JobSet
        self.pod_events: list[dict] = []  # watch events, each with the revision it made
        self.revision = 0  # etcd's: one counter over every write, every object's resourceVersion
        self.compacted = 0  # pod events at or below this revision are gone (compaction)
        self.gone_served = 0  # watches answered 410 Gone
        self.logs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.requests: list[tuple[str, str, dict]] = []
        self.delete_options: list[tuple[str, dict | None]] = []
        self.replies: list[tuple[str, str, int]] = []  # (method, path, status code)
        self.admission: dict[str, str] | None = {}  # None: queued until admit()
        self.instant_kubelet = True  # False: the test ends deleted running pods itself
        self.controllers = Controllers(self)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> KubeApiDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.lock:
            for pod in self.pods.values():  # release followers still streaming
                pod["status"]["phase"] = pod["status"].get("phase") or "Failed"
            self.lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- what the controllers call (under the lock) ----------------------------------------

    @staticmethod
    def now() -> str:
        return _now()

    def written(self, obj: dict) -> dict:
        """Every write gets the next revision as its resourceVersion, as etcd's does."""
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        if obj.get("kind") == "Pod":
            self.pod_events.append({"type": "MODIFIED", "object": json.loads(json.dumps(obj))})
        self.lock.notify_all()
        return obj

    def _pod_event(self, kind: str, pod: dict) -> None:
        self.revision += 1
        pod["metadata"]["resourceVersion"] = str(self.revision)
        self.pod_events.append({"type": kind, "object": json.loads(json.dumps(pod))})
        self.lock.notify_all()

    def create_job(self, job: dict) -> None:
        job["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])] = self.written(job)

    def delete_job(self, job: dict, *, foreground: bool) -> bool:
        if job["metadata"].get("deletionTimestamp"):
            return False
        job["metadata"].update(deletionTimestamp=_now(), finalizers=["foregroundDeletion"])
        self.written(job)
        return True

    def remove_job(self, job: dict) -> None:
        self.jobs.pop((job["metadata"]["namespace"], job["metadata"]["name"]), None)
        self.lock.notify_all()

    def create_pod(self, pod: dict) -> None:
        pod["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.pods[key] = pod
        self.logs.setdefault(key, [])
        self._pod_event("ADDED", pod)

    def delete_pod_gracefully(self, pod: dict) -> bool:
        """A pod that never started, or has ended, goes at once; a running one is marked
        deleted with its grace period, for the kubelet to stop."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp"):
            return False
        if pod["status"]["phase"] != "Running":
            self._remove_pod(key)
            return True
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        meta.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=grace)
        self._pod_event("MODIFIED", pod)
        if self.instant_kubelet:
            self._terminate(key, SIGTERM_EXIT, "")
            self._remove_pod(key)
        return True

    def _remove_pod(self, key: tuple[str, str]) -> None:
        gone = self.pods.pop(key, None)
        if gone:
            self._pod_event("DELETED", gone)

    def headless_service(self, jobset: dict) -> bool:
        """createHeadlessSvcIfNecessary: the Service for spec.network.subdomain."""
        network = jobset["spec"].get("network") or {}
        if not network.get("enableDNSHostnames"):
            return False
        meta = jobset["metadata"]
        ns, name = meta.get("namespace", "default"), network.get("subdomain") or meta["name"]
        if ("services", ns, name) in self.core:
            return False  # the controller uses an existing Service of that name
        self.core[("services", ns, name)] = self.written({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4()),
                         "ownerReferences": [{
                             "apiVersion": jobset["apiVersion"], "kind": "JobSet",
                             "name": meta["name"], "uid": meta["uid"], "controller": True,
                             "blockOwnerDeletion": True}]},
            "spec": {"clusterIP": "None", "selector": {JOBSET_LABEL: meta["name"]},
                     "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True)},
        })
        return True

    def _settle(self) -> None:
        """The controllers react to the write just made; then the garbage collector."""
        while True:
            self.controllers.reconcile()
            if not self._collect_deleted_jobsets():
                return

    def _collect_deleted_jobsets(self) -> bool:
        """Foreground deletion: a deleted JobSet's Jobs are deleted; it goes once they have,
        and what it owned (its Service, the ConfigMap) with it."""
        changed = False
        for key, js in list(self.jobsets.items()):
            if not js["metadata"].get("deletionTimestamp"):
                continue
            uid = js["metadata"]["uid"]
            jobs = [j for j in self.jobs.values() if any(
                r["uid"] == uid for r in j["metadata"]["ownerReferences"])]
            for job in jobs:
                changed |= self.delete_job(job, foreground=True)
            if not jobs:
                self._collect(self.jobsets.pop(key))
                changed = True
        return changed

    def _collect(self, jobset: dict) -> None:
        """The garbage collector: what the deleted JobSet owned goes with it."""
        uid = jobset["metadata"]["uid"]
        for key in [k for k, o in self.core.items() if any(
                r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]:
            del self.core[key]
        self.workloads.pop((jobset["metadata"]["namespace"], jobset["metadata"]["name"]), None)
        self.lock.notify_all()

    # -- the test plays the kubelet and Kueue's scheduler ----------------------------------

    def admit(self, ns: str, name: str, node_selector: dict[str, str] | None = None) -> None:
        with self.lock:
            self.controllers.kueue_admit(self.jobsets[(ns, name)], node_selector or {})
            self.written(self.jobsets[(ns, name)])
            self._settle()

    def preempt(self, ns: str, name: str, reason: str = "Preempted") -> None:
        with self.lock:
            self.controllers.kueue_evict(self.jobsets[(ns, name)], reason)
            self.written(self.jobsets[(ns, name)])
            self._settle()

    def compact(self) -> int:
        """Drop the pod events so far, as the API server's compaction does: a watch asking
        for an older resourceVersion gets 410 Gone. Returns the compacted revision."""
        with self.lock:
            # A cluster writes other objects all the time (leases, events): the revision
            # compacted at is past the last one a pod watcher has seen.
            self.revision += 1
            self.compacted = self.revision
            return self.compacted

    def wait_for_log_reader(self, ns: str, pod: str, timeout_s: float = 30) -> None:
        """Until a client has asked for this pod's log (a follower is attached)."""
        path = f"/api/v1/namespaces/{ns}/pods/{pod}/log"
        self.wait_until(lambda: any(p == path for _, p, _ in self.requests),
                        f"a reader of {pod}'s log", timeout_s)

    def wait_for_pod_watch(self, ns: str, timeout_s: float = 30) -> None:
        """Until a client watches this namespace's pods: what happens after is seen by it
        (a watch starts at the present, as the API server's does)."""
        path = f"/api/v1/namespaces/{ns}/pods"
        self.wait_until(lambda: any(p == path and q.get("watch") for _, p, q in self.requests),
                        f"a watch of {ns}'s pods", timeout_s)

    def wait_until(self, predicate, what: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"never happened: {what}")
                # Re-check often: a predicate may read what a client thread appends
                # without touching the API (no notify comes for it).
                self.lock.wait(timeout=min(left, 0.05))

    def wait_for_jobset(self, ns: str, name: str, timeout_s: float = 30) -> dict:
        self.wait_until(lambda: (ns, name) in self.jobsets, f"JobSet {ns}/{name}", timeout_s)
        return self.jobsets[(ns, name)]

    def wait_for_segment(self, ns: str, name: str, timeout_s: float = 30):
        """The JobSet, the ConfigMap the client creates after it and the controller's
        Service."""
        self.wait_until(lambda: ("configmaps", ns, f"{name}-job") in self.core,
                        f"ConfigMap {ns}/{name}-job", timeout_s)
        return (self.jobsets[(ns, name)], self.core[("configmaps", ns, f"{name}-job")],
                self.core[("services", ns, name)])

    def pods_of(self, ns: str, jobset: str, *, attempt: int | None = None) -> list[str]:
        """The JobSet's pods not being deleted, by completion index."""
        pods = [p for (pns, _), p in self.pods.items() if pns == ns
                and p["metadata"]["labels"].get(JOBSET_LABEL) == jobset
                and not p["metadata"].get("deletionTimestamp")
                and (attempt is None or p["metadata"]["labels"][RESTARTS_LABEL] == str(attempt))]
        pods.sort(key=lambda p: int(p["metadata"]["labels"][COMPLETION_INDEX]))
        return [p["metadata"]["name"] for p in pods]

    def wait_for_pods(self, ns: str, jobset: str, count: int, *, attempt: int = 0,
                      timeout_s: float = 30) -> list[str]:
        """The pods the Job controller made for this restart attempt, by completion index."""
        self.wait_until(lambda: len(self.pods_of(ns, jobset, attempt=attempt)) >= count,
                        f"{count} pod(s) of {jobset} attempt {attempt}", timeout_s)
        with self.lock:
            return self.pods_of(ns, jobset, attempt=attempt)

    def pod(self, ns: str, name: str) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.pods[(ns, name)]))

    def start_pods(self, ns: str, names: list[str]) -> None:
        """Several containers started at one instant (the controllers settle once after
        all of them): a follower's next poll sees the JobSet Running before its leader."""
        with self.lock:
            for name in names:
                self._start((ns, name))
            self._settle()

    def start_pod(self, ns: str, name: str) -> None:
        """The kubelet started the container: Running and Ready."""
        with self.lock:
            self._start((ns, name))
            self._settle()

    def _start(self, key) -> None:
        pod = self.pods[key]
        pod["status"] = {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}], "containerStatuses": [{
                "name": "trainer", "image": "fm-pipeline:test", "imageID": "",
                "ready": True, "restartCount": 0,
                "state": {"running": {"startedAt": _now()}}}]}
        self._pod_event("MODIFIED", pod)

    def log(self, ns: str, pod: str, text: str) -> None:
        with self.lock:
            for line in text.splitlines():
                self.logs[(ns, pod)].append((_now(), line))
            self.lock.notify_all()

    def terminate_pod(self, ns: str, pod: str, *, exit_code: int, message: str = "",
                      disruption: bool = False) -> None:
        """The container ended. `disruption`: the node was lost or the pod evicted (the
        condition DisruptionTarget the node lifecycle controller or the eviction API sets)."""
        with self.lock:
            self._terminate((ns, pod), exit_code, message, disruption=disruption)
            self._settle()

    def _terminate(self, key, exit_code: int, message: str, *, disruption: bool = False):
        pod = self.pods[key]
        status = pod["status"]
        status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        started = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get(
            "running", {}).get("startedAt", _now())
        status["containerStatuses"] = [{
            "name": "trainer", "image": "fm-pipeline:test", "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {
                "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "message": message, "startedAt": started, "finishedAt": _now()}}}]
        status["conditions"] = [{"type": "Ready", "status": "False"}] + (
            [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]
            if disruption else [])
        self._pod_event("MODIFIED", pod)

    def delete_pod(self, ns: str, pod: str) -> None:
        """The kubelet is done with a pod being deleted (or the test removes one)."""
        with self.lock:
            self._remove_pod((ns, pod))
            self._settle()

    def wait_for_pod_deletion(self, ns: str, pod: str, timeout_s: float = 60) -> int:
        """Until the pod is marked deleted (as the kubelet learns it); its grace period."""
        self.wait_until(lambda: self.pods.get((ns, pod), {}).get("metadata", {}).get(
            "deletionTimestamp"), f"pod {pod} deleted", timeout_s)
        return self.pods[(ns, pod)]["metadata"]["deletionGracePeriodSeconds"]

    def add_node(self, name: str, labels: dict[str, str]) -> None:
        with self.lock:
            self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                                "metadata": {"name": name, "labels": dict(labels),
                                             "resourceVersion": str(self.revision)}}

    # -- request handling -------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, body: dict | None):
        with self.lock:
            self.requests.append((method, path, query))
            self.lock.notify_all()
            if path.startswith(JOBSETS):
                ns, _, rest = path[len(JOBSETS):].partition("/jobsets")
                reply = self._jobsets(method, ns, rest.strip("/"), body)
                self._settle()
                return reply
            if path.startswith(DAEMONSETS) and path.partition("/daemonsets")[1]:
                ns, _, rest = path[len(DAEMONSETS):].partition("/daemonsets")
                return self._core(method, "daemonsets", ns, rest.strip("/"), body)
            parts = path.strip("/").split("/")  # api v1 namespaces NS KIND [NAME [log]]
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 and method == "GET":
                node = self.nodes.get(parts[3])
                return (200, node) if node else (404, _status(404, f'nodes "{parts[3]}" '
                                                                   "not found"))
            if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5:
                return 404, _status(404, f"no such endpoint {path}")
            ns, kind, name = parts[3], parts[4], "/".join(parts[5:])
            if kind in ("configmaps", "services"):
                return self._core(method, kind, ns, name, body)
            if kind == "pods" and method == "GET" and not name:
                selector = _selector(query)
                items = [p for (pns, _), p in self.pods.items() if pns == ns and all(
                    p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
                return 200, {"apiVersion": "v1", "kind": "PodList",
                             "metadata": {"resourceVersion": str(self.revision)},
                             "items": items}
            return 404, _status(404, f"no such endpoint {method} {path}")

    def _jobsets(self, method: str, ns: str, name: str, body: dict | None):
        if method == "POST" and not name:
            key = (ns, body["metadata"]["name"])
            if key in self.jobsets:
                return 409, _status(409, f'jobsets.jobset.x-k8s.io "{key[1]}" already exists')
            obj = json.loads(json.dumps(body))
            obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now(),
                                   namespace=ns)
            self.controllers.kueue_webhook(obj)  # admission webhooks run before the write
            self.jobsets[key] = self.written(obj)
            if key in self.workloads and self.admission is not None:
                self.controllers.kueue_admit(obj, self.admission)
                self.written(obj)
            return 201, json.loads(json.dumps(obj))
        if (ns, name) not in self.jobsets:
            return 404, _status(404, f'jobsets.jobset.x-k8s.io "{name}" not found')
        if method == "GET":
            return 200, json.loads(json.dumps(self.jobsets[(ns, name)]))
        if method == "DELETE":
            self.delete_options.append((f"{JOBSETS}{ns}/jobsets/{name}", body))
            obj = self.jobsets[(ns, name)]
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"].update(deletionTimestamp=_now(),
                                       finalizers=["foregroundDeletion"])
                self.written(obj)
            if (body or {}).get("propagationPolicy") != "Foreground":
                # Background: the JobSet goes now, the collector deletes its Jobs after.
                for job in self.jobs.values():
                    if any(r["uid"] == obj["metadata"]["uid"]
                           for r in job["metadata"]["ownerReferences"]):
                        self.delete_job(job, foreground=False)
                self._collect(self.jobsets.pop((ns, name)))
            return 200, json.loads(json.dumps(obj))
        return 405, _status(405, method)

    def _core(self, method: str, kind: str, ns: str, name: str, body: dict | None):
        if method == "POST" and not name:
            key = (kind, ns, body["metadata"]["name"])
            if key in self.core:
                return 409, _status(409, f"{kind} {key[2]} already exists")
            self.core[key] = self.written(json.loads(json.dumps(body)))
            return 201, self.core[key]
        if method == "DELETE" and (kind, ns, name) in self.core:
            return 200, self.core.pop((kind, ns, name))
        return 404, _status(404, f"{kind} {name} not found")

    def stream_watch(self, ns: str, query: dict, write) -> None:
        """Pod events as JSON lines for ?timeoutSeconds, as the API server sends them
        (docs: "API Concepts", efficient detection of changes): with ?resourceVersion,
        the events after it, or one ERROR event with a 410 Status when compaction has
        dropped them; without, the current pods as ADDED, then what follows."""
        selector = _selector(query)

        def matches(obj: dict) -> bool:
            meta = obj["metadata"]
            return meta["namespace"] == ns and all(
                meta["labels"].get(k) == v for k, v in selector.items())

        asked = query.get("resourceVersion", [""])[0]
        with self.lock:
            if asked and int(asked) < self.compacted:
                write((json.dumps({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f"too old resource version: {asked} ({self.compacted})",
                    "reason": "Expired", "code": 410}}) + "\n").encode())
                self.gone_served += 1
                return
            since = int(asked) if asked else self.revision
            current = [] if asked else [json.loads(json.dumps(p)) for p in self.pods.values()
                                        if matches(p)]
        for pod in current:
            write((json.dumps({"type": "ADDED", "object": pod}) + "\n").encode())
        deadline = time.monotonic() + float(query.get("timeoutSeconds", ["5"])[0])
        while time.monotonic() < deadline:
            with self.lock:
                events = [e for e in self.pod_events
                          if int(e["object"]["metadata"]["resourceVersion"]) > since]
                if not events:
                    self.lock.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                    continue
            since = int(events[-1]["object"]["metadata"]["resourceVersion"])
            for event in events:
                if matches(event["object"]):
                    write((json.dumps(event) + "\n").encode())

    def stream_log(self, ns: str, pod: str, query: dict, write) -> None:
        follow = _flag(query, "follow")
        stamps = _flag(query, "timestamps")
        sent = 0
        while True:
            with self.lock:
                lines = list(self.logs.get((ns, pod), []))[sent:]
                pod_obj = self.pods.get((ns, pod))
                done = pod_obj is None or pod_obj["status"]["phase"] in ("Succeeded", "Failed")
                if not lines and follow and not done:
                    self.lock.wait(timeout=1.0)
                    continue
            for stamp, line in lines:
                write(((f"{stamp} " if stamps else "") + line + "\n").encode())
            sent += len(lines)
            if not follow or (done and not lines):
                return


def _flag(query: dict, name: str) -> bool:
    return query.get(name, [""])[0].lower() in ("true", "1")  # the python client sends True


def _selector(query: dict) -> dict[str, str]:
    return dict(kv.split("=") for kv in query.get("labelSelector", [""])[0].split(",") if kv)


def _status(code: int, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message,
            "code": code}


def _handler(api: KubeApiDouble):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streams, as the API server sends them

        def log_message(self, *args):  # quiet
            pass

        def _stream(self, content_type: str, produce) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()

            def chunk(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                produce(chunk)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (a cancelled follower)
            self.close_connection = True

        def _dispatch(self, method: str):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            parts = url.path.strip("/").split("/")
            if method == "GET" and len(parts) == 5 and parts[4] == "pods" and _flag(query, "watch"):
                with api.lock:
                    api.requests.append((method, url.path, query))
                self._stream("application/json",
                             lambda chunk: api.stream_watch(parts[3], query, chunk))
                return
            if method == "GET" and len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
                with api.lock:
                    api.requests.append((method, url.path, query))
                    api.lock.notify_all()
                with api.lock:
                    known = (parts[3], parts[5]) in api.pods
                if not known:
                    return self._reply(404, _status(404, f"pod {parts[5]} not found"))
                self._stream("text/plain",
                             lambda chunk: api.stream_log(parts[3], parts[5], query, chunk))
                return
            code, payload = api.handle(method, url.path, query, body)
            with api.lock:
                api.replies.append((method, url.path, code))
            self._reply(code, payload)

        def _reply(self, code: int, payload: dict):
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

        def do_DELETE(self):
            self._dispatch("DELETE")

    return Handler
