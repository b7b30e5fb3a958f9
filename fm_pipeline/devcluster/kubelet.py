"""The process kubelet: registers the dev cluster's nodes and runs every pod the scheduler
binds to them as local processes. The only emulated part of the dev cluster.

    python -m fm_pipeline.devcluster.kubelet --kubeconfig K --state DIR   (nodes.json in DIR)

What it does, each as the kubelet documents it (kubernetes.io/docs/...):
- Node registration and heartbeats (concepts/architecture/nodes, "Node heartbeats"): the
  Node with its capacity and labels, its Ready condition, and a Lease in kube-node-lease
  renewed every 10 s, so the node-lifecycle controller keeps it schedulable.
- Pod lifecycle (concepts/workloads/pods/pod-lifecycle): Pending -> Running (podIP, hostIP,
  startTime, Ready) -> Succeeded/Failed by exit code under restartPolicy Never; OnFailure
  and Always restart the container in place (restartCount) after a back-off.
- Container status (same page, "Container states"): terminated with exitCode, reason
  Completed/Error and the termination message read from `terminationMessagePath`, or the
  log's tail under FallbackToLogsOnError (tasks/debug/debug-application/
  determine-reason-pod-failure).
- Termination (pod-lifecycle, "Termination of Pods"; container-lifecycle-hooks): on a
  deletion with a grace period the preStop exec hook runs, then SIGTERM, then SIGKILL once
  `deletionGracePeriodSeconds` has passed (a preStop still running at the deadline gets a
  one-off 2 s extension); then the kubelet deletes the pod with grace 0.
- Environment (tasks/inject-data-application/environment-variable-expose-pod-information):
  `value` with `$(VAR)` expansion, `fieldRef` (metadata.name/namespace/uid/labels/
  annotations, spec.nodeName/serviceAccountName, status.podIP/hostIP), configMap and secret
  keys, `envFrom`; the service variables KUBERNETES_SERVICE_HOST/PORT.
- Logs (reference/command-line-tools-reference/kubelet, the kubelet's HTTPS API that the
  apiserver proxies `pods/log` to): GET /containerLogs/<ns>/<pod>/<container> with
  follow, tailLines and limitBytes, served with a certificate of the cluster's CA to
  clients presenting one (the apiserver's --kubelet-client-certificate).
- Volumes (concepts/storage/volumes): emptyDir per pod, hostPath per node (it outlives the
  pod), configMap, secret, downwardAPI and projected (the service-account token from the
  TokenRequest API, ca.crt, namespace), a PersistentVolumeClaim as one folder per claim.

Each container runs in UTS and mount namespaces of its own with the pod's host name and an
/etc/hosts naming its peers (as a pod has them; torchrun orders ranks by host name and
hands rank 0's to the workers), so the kubelet needs root, as the multi-node tests do.

Emulated, and said so: there is no image (the command runs in this machine's Python
environment; `torchrun`, `python` and `fm` name its executables, the working directory is
the kubelet's); a mount path is a folder of the node's, and a path under a mountPath in the
command, args or env is rewritten to it; every node's address is 127.0.0.1, and a pod's
name under its Service (`<hostname>.<subdomain>`) resolves to its node's address by
rewriting it where the command or env names it and through the pod's /etc/hosts (each pod
has its own loopback address, 127.0.x.y); KUBERNETES_SERVICE_HOST is 127.0.0.1 (the
Service's cluster IP is not routed here). Resource limits are not enforced.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from fm_pipeline.devcluster.manifests import NodeSpec, node_object
from fm_pipeline.devcluster.rest import ApiError, Rest
from fm_pipeline.launch.pod_local import expand_k8s_vars, link_nested_mounts
from fm_pipeline.launch.reaper import end_tagged, signal_all, tagged
from fm_pipeline.rundir.torchrun import torchrun_executable

log = logging.getLogger("fm.kubelet")

NODE_ADDRESS = "127.0.0.1"
POD_TAG_ENV = "FM_DEV_POD"
LEASE_RENEW_S = 10
STATUS_EVERY_S = 30
RESTART_BACKOFF_S = 1.0
KUBELET_VERSION = "v1.36.3-fm-process-kubelet"
_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
# What the kubelet passes from its own environment: a container starts from its image's
# environment, and this machine's Python environment is that image here.
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
              "FM_DEV_CLUSTER")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_path(pod: dict) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


class Unresolved(Exception):
    """The pod names a peer (by its DNS name) that is not bound to a node yet."""


# -- what a container runs ----------------------------------------------------------------


@dataclass
class Prepared:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    mounts: dict[str, Path]
    termination_log: Path | None
    log_file: Path


class PodRunner:
    """One pod on one node: prepares it, runs its (single) container, reports, stops it."""

    def __init__(self, kubelet: ProcessKubelet, pod: dict):
        self.kubelet = kubelet
        self.api = kubelet.new_api()
        self.pod = pod
        self.uid = pod["metadata"]["uid"]
        self.node = pod["spec"]["nodeName"]
        self.dir = kubelet.state / "nodes" / self.node / "pods" / (
            f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_{self.uid[:8]}")
        self.ip = kubelet.pod_ip(self.uid)
        self.proc: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.restarts = 0
        self.pumped = threading.Event()
        self.started_at = now()

    # -- preparing ----------------------------------------------------------------------------

    def prepare(self) -> Prepared:
        spec = self.pod["spec"]
        if len(spec["containers"]) != 1 or spec.get("initContainers"):
            raise ValueError("the process kubelet runs pods of one container and no init "
                             "containers")
        container = spec["containers"][0]
        self.dir.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(spec, container)
        termination_log = None
        path = container.get("terminationMessagePath", "/dev/termination-log")
        termination_log = self.dir / "termination-log"
        termination_log.write_text("")
        mounts[path] = termination_log
        env = self._env(container)
        hosts = self.kubelet.peer_addresses(self.pod)
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if not argv:
            raise ValueError("no command: the process kubelet has no image to take an "
                             "entrypoint from")
        argv = [expand_k8s_vars(a, env) for a in argv]
        env = {k: _remap(_resolve(v, hosts), mounts) for k, v in env.items()}
        argv = [_remap(_resolve(a, hosts), mounts) for a in argv]
        hostname = spec.get("hostname") or self.pod["metadata"]["name"][:63]
        hosts_file = self._hosts_file(hostname, hosts)
        # The pod's own host name and /etc/hosts, in UTS and mount namespaces of its own
        # (root), as a pod has them: torchrun's c10d rendezvous orders ranks by the agents'
        # host names (so global rank 0 is on completion index 0, as on a real cluster) and
        # publishes rank 0's as the workers' store address, which the peers then resolve.
        argv = ["unshare", "--uts", "--mount", "--", "sh", "-c",
                'h=$0; f=$1; shift; mount --bind "$f" /etc/hosts && hostname "$h" && '
                'exec "$@"', hostname, str(hosts_file), *_executables(argv)]
        cwd = container.get("workingDir")
        cwd = _remap(cwd, mounts) if cwd else os.getcwd()
        base = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        full_env = {**base, **self.kubelet.image_env, "HOSTNAME": hostname,
                    "KUBERNETES_SERVICE_HOST": NODE_ADDRESS,
                    "KUBERNETES_SERVICE_PORT": str(self.kubelet.apiserver_port),
                    **env, POD_TAG_ENV: self.uid}
        return Prepared(argv=argv, env=full_env, cwd=cwd, mounts=mounts,
                        termination_log=termination_log,
                        log_file=self.dir / f"{container['name']}.log")

    def _hosts_file(self, hostname: str, peers: dict[str, str]) -> Path:
        """The pod's /etc/hosts: the machine's, its own name and its peers' (the names the
        cluster DNS would answer for the pods under the same Service)."""
        names: dict[str, list[str]] = {}
        for name, address in peers.items():  # longest (the FQDN) first: the canonical name
            names.setdefault(address, []).append(name)
        subdomain = self.pod["spec"].get("subdomain")
        own = [f"{hostname}.{subdomain}.{self.pod['metadata']['namespace']}.svc.cluster.local"
               ] if subdomain else []
        names[self.ip] = sorted(set(names.get(self.ip, []) + own), key=len, reverse=True) + [
            hostname]
        lines = [Path("/etc/hosts").read_text(errors="replace").rstrip("\n")]
        lines += [f"{address} {' '.join(sorted(set(n), key=lambda x: (-len(x), x)))}"
                  for address, n in sorted(names.items())]
        path = self.dir / "hosts"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _env(self, container: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        ns = self.pod["metadata"]["namespace"]
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._config_map(ns, source["configMapRef"]["name"])
            else:
                data = self._secret(ns, source["secretRef"]["name"])
            env.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env", []):
            name = item["name"]
            if "valueFrom" not in item:
                env[name] = expand_k8s_vars(item.get("value", ""), env)
                continue
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[name] = self._field(source["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[name] = self._config_map(ns, ref["name"])[ref["key"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[name] = self._secret(ns, ref["name"])[ref["key"]]
            else:
                raise ValueError(f"env {name}: {sorted(source)} is not emulated")
        return env

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "spec.nodeName": spec["nodeName"],
                  "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
                  "status.podIP": self.ip, "status.hostIP": NODE_ADDRESS,
                  "status.podIPs": self.ip, "status.hostIPs": NODE_ADDRESS}
        if path in simple:
            return simple[path]
        match = _FIELD_INDEX.match(path)
        if match:
            return (meta.get(match.group(1)) or {}).get(match.group(2), "")
        raise ValueError(f"fieldRef {path!r} is not emulated")

    def _config_map(self, ns: str, name: str) -> dict[str, str]:
        return self.api.get(f"/api/v1/namespaces/{ns}/configmaps/{name}").get("data") or {}

    def _secret(self, ns: str, name: str) -> dict[str, str]:
        data = self.api.get(f"/api/v1/namespaces/{ns}/secrets/{name}").get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def _volumes(self, spec: dict, container: dict) -> dict[str, Path]:
        ns = self.pod["metadata"]["namespace"]
        node_dir = self.kubelet.state / "nodes" / self.node
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        made: dict[str, Path] = {}
        for name, volume in volumes.items():
            local = self.dir / "volumes" / name
            if "hostPath" in volume:
                local = node_dir / "host" / volume["hostPath"]["path"].lstrip("/")
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                local = self.kubelet.state / "claims" / ns / claim
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                self._files(local, self._config_map(ns, volume["configMap"]["name"]),
                            volume["configMap"].get("items"))
            elif "secret" in volume:
                self._files(local, self._secret(ns, volume["secret"]["secretName"]),
                            volume["secret"].get("items"))
            elif "downwardAPI" in volume:
                for item in volume["downwardAPI"]["items"]:
                    (local / item["path"]).write_text(self._field(item["fieldRef"]["fieldPath"]))
            elif "projected" in volume:
                self._projected(local, volume["projected"]["sources"])
            elif not {"emptyDir", "hostPath", "persistentVolumeClaim"} & set(volume):
                raise ValueError(f"volume {name}: {sorted(set(volume) - {'name'})} is not "
                                 "emulated")
            made[name] = local
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            if mount["mountPath"] == "/dev/shm":
                continue  # this machine's shared memory is the real thing
            local = made[mount["name"]]
            if mount.get("subPath"):
                local = local / mount["subPath"]
                local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
        link_nested_mounts(mounts)
        return mounts

    @staticmethod
    def _files(folder: Path, data: dict[str, str], items: list | None) -> None:
        chosen = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        for key, rel in chosen.items():
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[key], encoding="utf-8")

    def _projected(self, folder: Path, sources: list[dict]) -> None:
        meta = self.pod["metadata"]
        for source in sources:
            if "serviceAccountToken" in source:
                sa = self.pod["spec"].get("serviceAccountName", "default")
                token = self.api.request(
                    "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
                    body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"expirationSeconds": source["serviceAccountToken"].get(
                              "expirationSeconds", 3600),
                              "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                 "name": meta["name"], "uid": meta["uid"]}}})
                (folder / source["serviceAccountToken"]["path"]).write_text(
                    token["status"]["token"])
            elif "configMap" in source:
                self._files(folder, self._config_map(meta["namespace"],
                                                     source["configMap"]["name"]),
                            source["configMap"].get("items"))
            elif "secret" in source:
                self._files(folder, self._secret(meta["namespace"], source["secret"]["name"]),
                            source["secret"].get("items"))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"]["items"]:
                    (folder / item["path"]).write_text(
                        self._field(item["fieldRef"]["fieldPath"]))

    # -- running ------------------------------------------------------------------------------

    def run(self) -> None:
        """In its own thread: run the container to its end (restarting per restartPolicy),
        report each state, and delete the pod when it was being deleted."""
        try:
            prepared = self.prepare()
        except Unresolved:
            self.kubelet.forget(self.uid)  # the next sync tries again
            return
        except (ValueError, KeyError, ApiError, OSError) as e:
            log.warning("pod %s cannot start: %s", self.pod["metadata"]["name"], e)
            self._report_failed_start(str(e))
            self.done.set()
            return
        policy = self.pod["spec"].get("restartPolicy", "Always")
        while True:
            code, message, reason = self._run_once(prepared)
            again = not self.stopping.is_set() and (
                policy == "Always" or (policy == "OnFailure" and code != 0))
            self._report_terminated(code, message, reason, final=not again)
            if not again:
                break
            self.restarts += 1
            time.sleep(RESTART_BACKOFF_S)
        self.done.set()
        if self.stopping.is_set():
            self.api.delete(pod_path(self.pod), grace_period_s=0)

    def _run_once(self, prepared: Prepared) -> tuple[int, str, str]:
        if prepared.termination_log is not None:
            prepared.termination_log.write_text("")
        self.pumped = threading.Event()
        self.proc = subprocess.Popen(prepared.argv, env=prepared.env, cwd=prepared.cwd,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        pump = threading.Thread(target=_pump, args=(self.proc.stdout, prepared.log_file,
                                                    self.pumped), daemon=True)
        pump.start()
        self.prepared = prepared
        self.started_at = now()
        self._report_running()
        code = self.proc.wait()
        pump.join(timeout=5)
        end_tagged(self.uid, grace_s=1.0, variable=POD_TAG_ENV)  # what it left behind
        exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128 + N
        message = ""
        if prepared.termination_log is not None and prepared.termination_log.exists():
            message = prepared.termination_log.read_text(errors="replace")[:4096]
        container = self.pod["spec"]["containers"][0]
        if (not message and exit_code != 0 and container.get("terminationMessagePolicy")
                == "FallbackToLogsOnError"):
            lines = prepared.log_file.read_text(errors="replace").splitlines()[-80:]
            message = "\n".join(line.partition(" ")[2] for line in lines)[-2048:]
        return exit_code, message, "Completed" if exit_code == 0 else "Error"

    def stop(self, grace_s: float) -> None:
        """Termination as the kubelet does it: preStop, SIGTERM, SIGKILL at the deadline."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        threading.Thread(target=self._terminate, args=(grace_s,), daemon=True).start()

    def _terminate(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        container = self.pod["spec"]["containers"][0]
        hook = container.get("lifecycle", {}).get("preStop", {}).get("exec")
        if hook and self.proc is not None and self.proc.poll() is None:
            prepared = self.prepared
            argv = [_remap(expand_k8s_vars(a, prepared.env), prepared.mounts)
                    for a in hook["command"]]
            pre = subprocess.Popen(argv, env=prepared.env, cwd=prepared.cwd,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                pre.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                deadline = time.monotonic() + 2.0  # the one-off extension
                try:
                    pre.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pre.kill()
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                end_tagged(self.uid, grace_s=0.0, variable=POD_TAG_ENV)

    def kill_now(self) -> None:
        self.stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGKILL)
        end_tagged(self.uid, grace_s=0.0, variable=POD_TAG_ENV)

    # -- reporting ----------------------------------------------------------------------------

    def _container_status(self, state: dict, *, ready: bool) -> dict:
        container = self.pod["spec"]["containers"][0]
        return {"name": container["name"], "image": container.get("image", ""),
                "imageID": "", "containerID": f"fm-process://{self.uid}/{self.restarts}",
                "ready": ready, "started": ready, "restartCount": self.restarts,
                "state": state}

    def _conditions(self, ready: bool) -> list[dict]:
        value = "True" if ready else "False"
        return [{"type": t, "status": s, "lastTransitionTime": now()} for t, s in (
            ("PodReadyToStartContainers", "True"), ("Initialized", "True"),
            ("Ready", value), ("ContainersReady", value), ("PodScheduled", "True"))]

    def _patch(self, status: dict) -> None:
        try:
            self.api.patch_status(pod_path(self.pod), {"status": status})
        except ApiError as e:
            if e.status != 404:  # deleted meanwhile (force-deleted): nothing to report to
                raise

    def _report_running(self) -> None:
        self._patch({"phase": "Running", "podIP": self.ip,
                     "podIPs": [{"ip": self.ip}], "hostIP": NODE_ADDRESS,
                     "hostIPs": [{"ip": NODE_ADDRESS}], "startTime": self.started_at,
                     "conditions": self._conditions(True),
                     "containerStatuses": [self._container_status(
                         {"running": {"startedAt": self.started_at}}, ready=True)]})

    def _report_terminated(self, code: int, message: str, reason: str, *, final: bool) -> None:
        terminated = {"exitCode": code, "reason": reason, "startedAt": self.started_at,
                      "finishedAt": now(), "containerID":
                      f"fm-process://{self.uid}/{self.restarts}"}
        if message:
            terminated["message"] = message
        status = {"conditions": self._conditions(False), "containerStatuses": [
            self._container_status({"terminated": terminated}, ready=False)]}
        if final:
            status["phase"] = "Succeeded" if code == 0 else "Failed"
        self._patch(status)

    def _report_failed_start(self, message: str) -> None:
        container = self.pod["spec"]["containers"][0]
        self._patch({"phase": "Failed", "reason": "CreateContainerError",
                     "message": message, "containerStatuses": [{
                         "name": container["name"], "image": container.get("image", ""),
                         "imageID": "", "ready": False, "restartCount": 0,
                         "state": {"waiting": {"reason": "CreateContainerError",
                                               "message": message}}}]})


def lose_pod(uid: str) -> list[int]:
    """SIGKILL every process of the pod `uid` at once, as a node's container dying does
    (no preStop, no SIGTERM, nothing reported first); returns the pids. For tests and
    benchmarks of a lost node."""
    pids = list(tagged(uid, variable=POD_TAG_ENV))
    signal_all(pids, signal.SIGKILL)
    return pids


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _executables(argv: list[str]) -> list[str]:
    """The image's commands, as this machine's Python environment has them."""
    head = argv[0]
    if head == "torchrun":
        return torchrun_executable() + argv[1:]
    if head in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    if head == "fm":
        local = Path(sys.executable).parent / "fm"
        return [str(local) if local.exists() else shutil.which("fm") or "fm", *argv[1:]]
    return argv


def _remap(value: str, mounts: dict[str, Path]) -> str:
    """A path under a mountPath, anywhere in the value (`--flag=/mnt/x`, `a:/mnt/b`)."""
    for mount_path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        value = re.sub(rf"(?<![\w/.-]){re.escape(mount_path)}(?=/|$|[^\w.-])",
                       str(local).replace("\\", "\\\\"), value)
    return value


def _resolve(value: str, hosts: dict[str, str]) -> str:
    for name in sorted(hosts, key=len, reverse=True):
        value = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", hosts[name], value)
    return value


# -- the kubelet's log API ----------------------------------------------------------------------


class _LogHandler(BaseHTTPRequestHandler):
    kubelet: ProcessKubelet  # set on the subclass made per server

    def log_message(self, *args):  # the apiserver polls; keep the kubelet's log readable
        pass

    def do_GET(self):
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.send_error(404, "only /containerLogs/<ns>/<pod>/<container> is served")
            return
        _, ns, name, container = parts
        runner = self.kubelet.runner_named(ns, name)
        if runner is None or not hasattr(runner, "prepared"):
            self.send_error(404, f"no container {container!r} of pod {ns}/{name} ran here")
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        path = runner.prepared.log_file
        since = (time.time() - int(query["sinceSeconds"])) if "sinceSeconds" in query else None
        stamped = query.get("timestamps") == "true"
        budget = int(query["limitBytes"]) if "limitBytes" in query else None
        with open(path, "rb") as f:
            lines = _complete_lines(f)
            if "tailLines" in query:
                lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
            try:
                budget = self._write(lines, budget, since, stamped)
                while query.get("follow") == "true" and budget != 0:
                    finished = runner.done.is_set() or runner.pumped.is_set()
                    more = _complete_lines(f)
                    budget = self._write(more, budget, since, stamped)
                    if finished and not more:
                        break
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass

    def _write(self, lines: list[bytes], budget: int | None, since: float | None,
               stamped: bool) -> int | None:
        out = b""
        for line in lines:
            stamp, _, text = line.partition(b" ")
            if since is not None and _epoch(stamp) < since:
                continue
            out += line if stamped else text
        if budget is not None:
            out = out[:budget]
            budget -= len(out)
        if out:
            self.wfile.write(out)
            self.wfile.flush()
        return budget


def _complete_lines(f) -> list[bytes]:
    """The whole lines from the file's position on; a partial last line is left for later."""
    start = f.tell()
    data = f.read()
    end = data.rfind(b"\n") + 1
    f.seek(start + end)
    return data[:end].splitlines(keepends=True)


def _epoch(stamp: bytes) -> float:
    return datetime.datetime.strptime(stamp.decode(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def _pump(stream, log_file: Path, done: threading.Event) -> None:
    """The container's output, line by line, into its log with the time each line came
    (as the kubelet's CRI log format keeps it): `timestamps=true` and `sinceSeconds` are
    what dagster-k8s's Pipes reader asks for."""
    with open(log_file, "ab") as out:
        for line in iter(stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            out.write(micro_now().encode() + b" " + line)
            out.flush()
    stream.close()
    done.set()


def serve_logs(kubelet: ProcessKubelet, *, cert: Path, key: Path, ca: Path) -> ThreadingHTTPServer:
    handler = type("Handler", (_LogHandler,), {"kubelet": kubelet})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    context.load_verify_locations(str(ca))
    context.verify_mode = ssl.CERT_REQUIRED  # only the apiserver, with a cert of our CA
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="kubelet-api").start()
    return server


# -- the kubelet -------------------------------------------------------------------------------


class ProcessKubelet:
    def __init__(self, kubeconfig: Path, state: Path, nodes: list[NodeSpec],
                 kubelet_port: int = 0, image_env: dict[str, str] | None = None):
        self.kubelet_port = kubelet_port
        self.image_env = dict(image_env or {})
        self.kubeconfig = kubeconfig
        self.api = Rest.from_kubeconfig(kubeconfig)
        self.apiserver_port = int(self.api.server.rsplit(":", 1)[1])
        self.state = state
        self.nodes = {n.name: n for n in nodes}
        self.pods: dict[str, PodRunner] = {}
        self._ips: dict[str, str] = {}
        self.lock = threading.Lock()
        self._leases_at = 0.0
        self._status_at = 0.0

    def new_api(self) -> Rest:
        return Rest.from_kubeconfig(self.kubeconfig)

    def pod_ip(self, uid: str) -> str:
        """The pod's own address: one of 127.0.0.0/8 (all loopback on Linux), given on first
        use and kept while this kubelet runs, so that every pod's name resolves to it and
        its address resolves back to its name (torchrun identifies an agent that way)."""
        with self.lock:
            if uid not in self._ips:
                n = len(self._ips)
                self._ips[uid] = f"127.{1 + n // 62500}.{1 + n // 250 % 250}.{1 + n % 250}"
            return self._ips[uid]

    def runner_named(self, ns: str, name: str) -> PodRunner | None:
        with self.lock:
            return next((r for r in self.pods.values() if r.pod["metadata"]["namespace"] == ns
                         and r.pod["metadata"]["name"] == name), None)

    def forget(self, uid: str) -> None:
        with self.lock:
            self.pods.pop(uid, None)

    # -- nodes --------------------------------------------------------------------------------

    def register(self) -> None:
        for node in self.nodes.values():
            obj = node_object(node)
            status = obj.pop("status")
            try:
                self.api.create(obj)
            except ApiError as e:
                if e.status != 409:
                    raise
            self._node_status(node.name, status)
        self.heartbeat(force=True)

    def _node_status(self, name: str, extra: dict | None = None) -> None:
        stamp = now()
        conditions = [
            {"type": t, "status": "False", "reason": f"KubeletHasSufficient{r}",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            for t, r in (("MemoryPressure", "Memory"), ("DiskPressure", "Disk"),
                         ("PIDPressure", "PID"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "fm-pipeline process kubelet is posting ready status",
                           "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        status = {"conditions": conditions,
                  "addresses": [{"type": "InternalIP", "address": NODE_ADDRESS},
                                {"type": "Hostname", "address": name}],
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
                  "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "operatingSystem": "linux",
                               "architecture": "amd64", "containerRuntimeVersion":
                               "fm-process://1", "kernelVersion": os.uname().release,
                               "osImage": "fm-pipeline dev cluster", "machineID": "",
                               "systemUUID": "", "bootID": "", "kubeProxyVersion": ""},
                  **(extra or {})}
        self.api.patch_status(f"/api/v1/nodes/{name}", {"status": status})

    def heartbeat(self, *, force: bool = False) -> None:
        t = time.monotonic()
        if force or t - self._leases_at >= LEASE_RENEW_S:
            self._leases_at = t
            for name in self.nodes:
                self.api.apply({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                             "renewTime": micro_now()}})
        if force or t - self._status_at >= STATUS_EVERY_S:
            self._status_at = t
            for name in self.nodes:
                self._node_status(name)

    # -- pods ---------------------------------------------------------------------------------

    def peer_addresses(self, pod: dict) -> dict[str, str]:
        """DNS names of the pods under the pod's Service (`<hostname>.<subdomain>`, with the
        namespace and cluster suffixes) -> their pod addresses. Raises Unresolved when the
        pod's command or env names a peer that is not bound to a node yet."""
        ns = pod["metadata"]["namespace"]
        subdomain = pod["spec"].get("subdomain")
        if not subdomain:
            return {}
        hosts: dict[str, str] = {}
        for peer in self.api.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
            spec = peer["spec"]
            if spec.get("subdomain") != subdomain or not spec.get("hostname"):
                continue
            if not spec.get("nodeName") or peer["metadata"].get("deletionTimestamp"):
                continue
            base = f"{spec['hostname']}.{subdomain}"
            for name in (f"{base}.{ns}.svc.cluster.local", f"{base}.{ns}.svc", f"{base}.{ns}",
                         base):
                hosts[name] = self.pod_ip(peer["metadata"]["uid"])
        text = json.dumps(pod["spec"]["containers"])
        for named in re.findall(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.{re.escape(subdomain)}\b",
                                text):
            if f"{named[0]}.{subdomain}" not in hosts:
                raise Unresolved(f"{named[0]}.{subdomain}")
        return hosts

    def sync(self) -> None:
        pods = [p for p in self.api.get("/api/v1/pods")["items"]
                if p["spec"].get("nodeName") in self.nodes]
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self.lock:
                runner = self.pods.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if runner is not None and not runner.done.is_set():
                    runner.stop(float(pod["metadata"].get("deletionGracePeriodSeconds", 30)))
                elif runner is None or runner.done.is_set():
                    self.api.delete(pod_path(pod), grace_period_s=0)
                continue
            if runner is not None or pod.get("status", {}).get("phase") in ("Succeeded",
                                                                           "Failed"):
                continue
            runner = PodRunner(self, pod)
            with self.lock:
                self.pods[uid] = runner
            threading.Thread(target=runner.run, name=f"pod-{pod['metadata']['name']}",
                             daemon=True).start()
        with self.lock:
            gone = [r for uid, r in self.pods.items() if uid not in seen]
            for runner in gone:
                self.pods.pop(runner.uid, None)
        for runner in gone:  # force-deleted (grace 0) while running: no grace left
            runner.kill_now()

    def shutdown(self) -> None:
        with self.lock:
            runners = list(self.pods.values())
        for runner in runners:
            runner.kill_now()

    def serve(self, stop: threading.Event, *, tick_s: float = 0.3) -> None:
        self.register()
        while not stop.is_set():
            try:
                self.heartbeat()
                self.sync()
            except (ApiError, OSError) as e:
                log.warning("sync: %s", e)
            stop.wait(tick_s)
        self.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    described = json.loads((args.state / "nodes.json").read_text())
    nodes = [NodeSpec(**n) for n in described["nodes"]]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    kubelet = ProcessKubelet(args.kubeconfig, args.state, nodes,
                             image_env=described["image_env"])
    pki = args.state / "pki"
    server = serve_logs(kubelet, cert=pki / "kubelet-serving.crt",
                        key=pki / "kubelet-serving.key", ca=pki / "ca.crt")
    kubelet.kubelet_port = server.server_address[1]
    kubelet.serve(stop)


if __name__ == "__main__":
    main()
