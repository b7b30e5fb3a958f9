"""A Kubernetes cluster on 127.0.0.1 from the real components, with pods run as processes.

    cluster = DevCluster(components, state_dir, nodes=default_nodes(), tenants=tenants)
    info = cluster.up()            # etcd, apiserver, controller-manager, scheduler, JobSet,
                                   # Kueue, the process kubelet, Kueue's objects
    ... kubernetes clients use info.kubeconfig ...
    cluster.down()                 # every process the cluster started, its pods included

What runs is the real thing, built from the pinned Go modules (build.py): etcd, the
kube-apiserver (its certificates and service-account keys made locally, the default
admission plugins, RBAC), the kube-controller-manager (the Job, garbage-collector,
node-lifecycle, service-account controllers ...), the kube-scheduler, the JobSet and Kueue
managers (their webhooks served on 127.0.0.1; the webhook configurations point there with
our CA). Only the node is emulated: `kubelet.py` registers the nodes and runs each pod
bound to them as local processes. State (certificates, etcd's data, logs, kubeconfig)
lives in one folder; `cluster.json` there says what runs, for `status` and `down`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from fm_pipeline.devcluster import manifests, pki, processes
from fm_pipeline.devcluster.build import Components
from fm_pipeline.devcluster.manifests import NodeSpec
from fm_pipeline.devcluster.rest import ApiError, Rest
from fm_pipeline.resilience.ports import quiet_port
from fm_pipeline.scheduling.kueue import render_kueue
from fm_pipeline.scheduling.tenants import TenantsConfig

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
START_TIMEOUT_S = 120.0


class ClusterError(RuntimeError):
    pass


def default_nodes(count: int = 2, *, gpus: int = 2, cpu: int = 8) -> list[NodeSpec]:
    """`count` nodes, two to a rack, one block, each with the labels Kueue's flavor and
    topology select on (dev_cluster_tenants.yaml)."""
    return [NodeSpec(name=f"node-{i}", cpu=cpu, gpus=gpus, labels={
        "nvidia.com/gpu.present": "true",
        "cloud.provider.com/topology-block": "block-0",
        "cloud.provider.com/topology-rack": f"rack-{i // 2}"}) for i in range(count)]


@dataclass(frozen=True)
class ClusterInfo:
    state: str
    tag: str
    server: str
    kubeconfig: str
    ports: dict[str, int]
    versions: dict[str, str]
    nodes: list[str]
    started_at: float

    @classmethod
    def read(cls, state: Path) -> ClusterInfo | None:
        path = state / "cluster.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


class DevCluster:
    def __init__(self, components: Components, state: Path, *, nodes: Sequence[NodeSpec],
                 tenants: TenantsConfig | None, attached: bool = True,
                 image_env: dict[str, str] | None = None):
        """`image_env`: what every pod's environment starts from, as an image's ENV would
        (the process kubelet passes nothing else of its own environment but PATH and the
        like)."""
        self.components = components
        self.state = Path(state).resolve()
        self.nodes = list(nodes)
        self.tenants = tenants
        self.attached = attached
        self.image_env = dict(image_env or {})

    # -- paths --------------------------------------------------------------------------------

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    def _pki(self) -> Path:
        return self.state / "pki"

    # -- up ----------------------------------------------------------------------------------

    PORTS = ("etcd", "etcd_peer", "apiserver", "jobset_webhook", "jobset_health",
             "kueue_webhook", "kueue_health")
    START_ATTEMPTS = 3  # a port taken between its choice and its bind: start again

    def up(self, progress: Callable[[str], None] = lambda _: None) -> ClusterInfo:
        existing = ClusterInfo.read(self.state)
        if existing is not None and processes.running(existing.tag):
            raise ClusterError(f"a dev cluster already runs from {self.state} (its server "
                               f"{existing.server}): `fm dev cluster down` first")
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                return self._up(progress)
            except processes.ComponentFailed as e:
                if "address already in use" not in str(e) or attempt == self.START_ATTEMPTS:
                    raise
                progress(f"a port was taken while starting ({str(e).splitlines()[0]}); "
                         "starting again on other ports")
                shutil.rmtree(self.state / "etcd", ignore_errors=True)
        raise AssertionError("unreachable")

    def _up(self, progress: Callable[[str], None]) -> ClusterInfo:
        tag = uuid.uuid4().hex
        self.tag = tag
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "cluster.json").unlink(missing_ok=True)
        ports: dict[str, int] = {}
        while len(ports) < len(self.PORTS):  # seven distinct ports
            port = quiet_port()
            if port not in ports.values():
                ports[self.PORTS[len(ports)]] = port
        try:
            self._certificates()
            server = f"https://127.0.0.1:{ports['apiserver']}"
            progress("etcd")
            self._etcd(ports)
            progress("kube-apiserver")
            self._apiserver(ports)
            api = Rest.from_kubeconfig(self.kubeconfig)
            progress("CRDs and webhook configurations (JobSet, Kueue)")
            self._install(api, ports)
            progress("kube-controller-manager, kube-scheduler")
            self._controllers(server)
            progress("JobSet and Kueue managers")
            self._managers(ports)
            progress(f"process kubelet for {', '.join(n.name for n in self.nodes)}")
            self._kubelet(api)
            if self.tenants is not None:
                progress("Kueue objects for the tenants")
                self._apply_with_retry(api, render_kueue(self.tenants))
            self._wait_for_service_accounts(api)
        except BaseException:
            processes.stop_all(tag)
            raise
        info = ClusterInfo(state=str(self.state), tag=tag, server=server,
                           kubeconfig=str(self.kubeconfig), ports=ports,
                           versions=self.components.versions,
                           nodes=[n.name for n in self.nodes], started_at=time.time())
        (self.state / "cluster.json").write_text(json.dumps(asdict(info), indent=1))
        return info

    def _start(self, name: str, argv: list[str], env: dict | None = None):
        return processes.start(name, argv, tag=self.tag, logs=self.logs,
                               attached=self.attached, env=env)

    def _certificates(self) -> None:
        ca = pki.Authority(self._pki())
        self.ca = ca
        self.serving = ca.issue("apiserver", cn="kube-apiserver", server=True,
                                hosts=("127.0.0.1", KUBERNETES_SERVICE_IP,
                                       *pki.APISERVER_NAMES))
        ca.issue("kubelet-serving", cn="fm-dev-process-kubelet", server=True,
                 hosts=("127.0.0.1", "localhost"))
        self.kubelet_client = ca.issue("apiserver-kubelet-client", cn="kube-apiserver",
                                       orgs=("system:masters",))
        webhook = ca.issue("webhook", cn="fm-dev-webhooks", server=True,
                           hosts=("127.0.0.1", "localhost"))
        for manager in ("jobset", "kueue", "kueue-metrics"):
            folder = self.state / "webhook-certs" / manager
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "tls.crt").write_bytes(webhook.cert.read_bytes())
            (folder / "tls.key").write_bytes(webhook.key.read_bytes())
        metrics = manifests.KUEUE_METRICS_CERTS
        if not (metrics / "tls.crt").exists():
            try:
                metrics.mkdir(parents=True, exist_ok=True)
                for name in ("tls.crt", "tls.key"):
                    (metrics / name).write_bytes(
                        (self.state / "webhook-certs" / "kueue-metrics" / name).read_bytes())
            except OSError as e:
                raise ClusterError(f"Kueue reads a certificate from {metrics} and it cannot "
                                   f"be written here ({e}): run as root once, or create "
                                   "it (any tls.crt/tls.key pair)") from None
        self.sa = pki.service_account_keys(self._pki())
        # Who each client is, as the apiserver's x509 authenticator reads it (CN = user,
        # O = groups). The controller-manager and scheduler have their built-in roles;
        # the JobSet and Kueue managers, the kubelet and the admin are cluster admins here.
        self.identities = {
            "admin": ca.issue("admin", cn="fm-admin", orgs=("system:masters",)),
            "controller-manager": ca.issue("controller-manager",
                                           cn="system:kube-controller-manager"),
            "scheduler": ca.issue("scheduler", cn="system:kube-scheduler"),
            "jobset": ca.issue("jobset", cn="fm-dev:jobset-manager", orgs=("system:masters",)),
            "kueue": ca.issue("kueue", cn="fm-dev:kueue-manager", orgs=("system:masters",)),
            "kubelet": ca.issue("kubelet", cn="fm-dev:process-kubelet",
                                orgs=("system:masters",)),
        }

    def _write_kubeconfig(self, path: Path, server: str, pair: pki.KeyPair) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fm-dev",
            "clusters": [{"name": "fm-dev", "cluster": {
                "server": server, "certificate-authority": str(self.ca.cert_path)}}],
            "users": [{"name": "fm-dev", "user": {"client-certificate": str(pair.cert),
                                                  "client-key": str(pair.key)}}],
            "contexts": [{"name": "fm-dev", "context": {"cluster": "fm-dev",
                                                        "user": "fm-dev"}}],
        }))
        path.chmod(0o600)
        return path

    def _etcd(self, ports: dict[str, int]) -> None:
        client = f"http://127.0.0.1:{ports['etcd']}"
        peer = f"http://127.0.0.1:{ports['etcd_peer']}"
        proc = self._start("etcd", [
            str(self.components.binary("etcd")), "--name", "dev",
            "--data-dir", str(self.state / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"dev={peer}", "--initial-cluster-state", "new",
            # A dev cluster: its data is not worth an fsync per write on a shared disk.
            "--unsafe-no-fsync", "--log-level", "warn"])
        processes.wait_http(f"{client}/health", timeout_s=30, what="etcd",
                            log=self.logs / "etcd.log", proc=proc)

    def _apiserver(self, ports: dict[str, int]) -> None:
        port = ports["apiserver"]
        server = f"https://127.0.0.1:{port}"
        proc = self._start("kube-apiserver", [
            str(self.components.binary("kube-apiserver")),
            "--etcd-servers", f"http://127.0.0.1:{ports['etcd']}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(port),
            "--tls-cert-file", str(self.serving.cert),
            "--tls-private-key-file", str(self.serving.key),
            "--client-ca-file", str(self.ca.cert_path),
            "--service-account-issuer", server,
            "--service-account-key-file", str(self.sa.cert),
            "--service-account-signing-key-file", str(self.sa.key),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type", "none",  # 127.0.0.1 is no endpoint for pods
            # pods/log is proxied to the process kubelet's HTTPS API, verified both ways.
            "--kubelet-certificate-authority", str(self.ca.cert_path),
            "--kubelet-client-certificate", str(self.kubelet_client.cert),
            "--kubelet-client-key", str(self.kubelet_client.key),
            "--kubelet-preferred-address-types", "InternalIP",
        ])
        for name, pair in self.identities.items():
            self._write_kubeconfig(
                self.kubeconfig if name == "admin"
                else self.state / "kubeconfigs" / f"{name}.yaml", server, pair)
        admin = self.identities["admin"]
        processes.wait_https(f"{server}/readyz", ca=self.ca.cert_path,
                             cert=(admin.cert, admin.key), timeout_s=START_TIMEOUT_S,
                             what="kube-apiserver", log=self.logs / "kube-apiserver.log",
                             proc=proc)

    def _install(self, api: Rest, ports: dict[str, int]) -> None:
        ca_pem = self.ca.cert_path.read_bytes()
        for ns in manifests.namespaces():
            api.apply(ns)
        crds = manifests.crds(self.components)
        manifests.conversion_webhooks(crds, kueue_port=ports["kueue_webhook"], ca_pem=ca_pem)
        for crd in crds:
            api.apply(crd)
        deadline = time.monotonic() + 60
        for crd in crds:
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            while not any(c["type"] == "Established" and c["status"] == "True"
                          for c in (api.get(path).get("status") or {}).get("conditions") or []):
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {crd['metadata']['name']} not established")
                time.sleep(0.2)
        for config in manifests.webhook_configurations(
                self.components, jobset_port=ports["jobset_webhook"],
                kueue_port=ports["kueue_webhook"], ca_pem=ca_pem):
            api.apply(config)

    def _controllers(self, server: str) -> None:
        kubeconfigs = self.state / "kubeconfigs"
        self._start("kube-controller-manager", [
            str(self.components.binary("kube-controller-manager")),
            "--kubeconfig", str(kubeconfigs / "controller-manager.yaml"),
            "--authentication-kubeconfig", str(kubeconfigs / "controller-manager.yaml"),
            "--authorization-kubeconfig", str(kubeconfigs / "controller-manager.yaml"),
            "--bind-address", "127.0.0.1", "--secure-port", "0",
            "--leader-elect=false",
            "--service-account-private-key-file", str(self.sa.key),
            "--root-ca-file", str(self.ca.cert_path),
            "--use-service-account-credentials=true",  # each controller its own role, as kubeadm
            "--service-cluster-ip-range", SERVICE_CIDR,
            # Job status is read often by the launcher; the defaults' 1 s sync is fine.
            "--controllers", "*,-csrsigning,-csrapproving,-nodeipam,-cloud-node-lifecycle"])
        self._start("kube-scheduler", [
            str(self.components.binary("kube-scheduler")),
            "--kubeconfig", str(kubeconfigs / "scheduler.yaml"),
            "--authentication-kubeconfig", str(kubeconfigs / "scheduler.yaml"),
            "--authorization-kubeconfig", str(kubeconfigs / "scheduler.yaml"),
            "--bind-address", "127.0.0.1", "--secure-port", "0", "--leader-elect=false"])

    def _managers(self, ports: dict[str, int]) -> None:
        configs = self.state / "config"
        configs.mkdir(parents=True, exist_ok=True)
        kubeconfigs = self.state / "kubeconfigs"
        started = []
        for name, make in (("jobset", manifests.jobset_config),
                           ("kueue", manifests.kueue_config)):
            config = make(webhook_port=ports[f"{name}_webhook"],
                          health_port=ports[f"{name}_health"],
                          cert_dir=self.state / "webhook-certs" / name)
            (configs / f"{name}.yaml").write_text(yaml.safe_dump(config))
            namespace = (manifests.KUEUE_NAMESPACE if name == "kueue"
                         else manifests.JOBSET_NAMESPACE)
            proc = self._start(name, [
                str(self.components.binary(name)), f"--config={configs / f'{name}.yaml'}",
                f"--kubeconfig={kubeconfigs / f'{name}.yaml'}",
                *(manifests.KUEUE_FLAGS if name == "kueue" else ())],
                env={"POD_NAMESPACE": namespace, "NAMESPACE": namespace})
            started.append((name, proc))
        for name, proc in started:
            processes.wait_http(f"http://127.0.0.1:{ports[f'{name}_health']}/readyz",
                                timeout_s=START_TIMEOUT_S, what=f"the {name} manager",
                                log=self.logs / f"{name}.log", proc=proc)

    def _kubelet(self, api: Rest) -> None:
        (self.state / "nodes.json").write_text(json.dumps(
            {"nodes": [asdict(n) for n in self.nodes], "image_env": self.image_env}))
        proc = self._start("kubelet", [
            sys.executable, "-m", "fm_pipeline.devcluster.kubelet",
            "--kubeconfig", str(self.state / "kubeconfigs" / "kubelet.yaml"),
            "--state", str(self.state)])
        deadline = time.monotonic() + 60
        while True:
            ready = {n["metadata"]["name"] for n in api.get("/api/v1/nodes")["items"]
                     if any(c["type"] == "Ready" and c["status"] == "True"
                            for c in (n.get("status") or {}).get("conditions") or [])}
            if ready >= {n.name for n in self.nodes}:
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError("the process kubelet did not register its nodes"
                                   f"{processes.log_tail(self.logs / 'kubelet.log')}")
            time.sleep(0.25)

    def _wait_for_service_accounts(self, api: Rest) -> None:
        """Until every namespace has its `default` ServiceAccount: the controller-manager
        makes them, and the ServiceAccount admission plugin refuses pods before that."""
        deadline = time.monotonic() + 30
        while True:
            namespaces = {n["metadata"]["name"] for n in api.get("/api/v1/namespaces")["items"]}
            ready = {sa["metadata"]["namespace"]
                     for sa in api.get("/api/v1/serviceaccounts")["items"]
                     if sa["metadata"]["name"] == "default"}
            if namespaces <= ready:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"no default ServiceAccount in {sorted(namespaces - ready)}")
            time.sleep(0.2)

    def _apply_with_retry(self, api: Rest, objs: list[dict]) -> None:
        for obj in objs:
            deadline = time.monotonic() + 30
            while True:
                try:
                    api.apply(obj)
                    break
                except ApiError as e:
                    # A webhook whose server has just started can refuse a connection once.
                    if e.status != 500 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

    # -- down / status ------------------------------------------------------------------------

    def down(self) -> list[int]:
        return down(self.state)


def down(state: Path) -> list[int]:
    """End every process of the cluster whose state is in `state` (its pods too)."""
    info = ClusterInfo.read(Path(state))
    tag = info.tag if info else None
    if tag is None:
        return []
    ended = processes.stop_all(tag)
    (Path(state) / "cluster.json").unlink(missing_ok=True)
    return ended


def status(state: Path) -> dict:
    """What runs, as the apiserver and the process table say."""
    info = ClusterInfo.read(Path(state))
    if info is None:
        return {"up": False, "state": str(state)}
    pids = processes.running(info.tag)
    out = {"up": bool(pids), "state": str(state), "server": info.server,
           "kubeconfig": info.kubeconfig, "processes": len(pids), "versions": info.versions}
    if pids:
        try:
            api = Rest.from_kubeconfig(Path(info.kubeconfig))
            out["nodes"] = {
                n["metadata"]["name"]: next((c["status"] for c in n["status"]["conditions"]
                                             if c["type"] == "Ready"), "Unknown")
                for n in api.get("/api/v1/nodes")["items"]}
            out["version"] = api.get("/version")["gitVersion"]
        except (OSError, ApiError) as e:
            out["error"] = str(e)
    return out

