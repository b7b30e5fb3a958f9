"""What the dev cluster installs, taken from the JobSet and Kueue modules that were built.

Their `config/components` folders are kustomize bases written for an in-cluster install
(a webhook Service in a `system` namespace, cert-manager or the managers' own certificate
rotation). Here the managers run as processes on 127.0.0.1, so the same objects are
installed with what kustomize would have done plus one change envtest makes too: each
webhook's `clientConfig.service` becomes a `url` on 127.0.0.1 with our CA as `caBundle`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fm_pipeline.devcluster.build import Components

# Kueue integrations the cluster enables: JobSets (training segments) and batch Jobs (the
# data mix's steps). Webhooks of the frameworks left out are not installed: their handlers
# are not served, and with failurePolicy Fail they would refuse those kinds outright.
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")
_KUEUE_FRAMEWORK_WEBHOOKS = {
    "appwrapper", "deployment", "jaxjob", "leaderworkerset", "mpijob", "paddlejob", "pod",
    "pytorchjob", "raycluster", "rayjob", "rayservice", "sparkapplication", "statefulset",
    "tfjob", "trainjob", "xgboostjob", "job", "jobset",
}
_KUEUE_KEPT_FRAMEWORKS = {"job", "jobset"}
KUEUE_NAMESPACE = "kueue-system"
JOBSET_NAMESPACE = "jobset-system"
# What Kueue's kustomization sets on its framework webhooks (config/components/webhook).
_KUEUE_NAMESPACE_SELECTOR = {"matchExpressions": [{
    "key": "kubernetes.io/metadata.name", "operator": "NotIn",
    "values": ["kube-system", KUEUE_NAMESPACE]}]}


@dataclass(frozen=True)
class NodeSpec:
    """A node the process kubelet registers: what it says it has (nothing here is a GPU:
    `gpus` is an advertised extended resource the scheduler and Kueue count)."""
    name: str
    cpu: int = 4
    memory_gib: int = 16
    gpus: int = 2
    labels: dict[str, str] = field(default_factory=dict)


def _load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crds(components: Components) -> list[dict]:
    return [doc for module in ("jobset", "kueue") for path in components.crds(module)
            for doc in _load_all(path)]


def _point_at(webhook: dict, url_base: str, ca_bundle: str) -> dict:
    service = webhook["clientConfig"]["service"]
    webhook["clientConfig"] = {"url": url_base + service["path"], "caBundle": ca_bundle}
    return webhook


def webhook_configurations(components: Components, *, jobset_port: int, kueue_port: int,
                           ca_pem: bytes) -> list[dict]:
    ca_bundle = base64.b64encode(ca_pem).decode()
    out = []
    jobset = _load_all(components.source("jobset") / "webhook" / "manifests.yaml")
    patches = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
               "ValidatingWebhookConfiguration": "validating-patch.yaml"}
    for config in jobset:
        for op in yaml.safe_load((components.source("jobset") / "webhook" / "patches"
                                  / patches[config["kind"]]).read_text()):
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            config["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        config["metadata"]["name"] = "jobset-" + config["metadata"]["name"]
        config["webhooks"] = [_point_at(w, f"https://127.0.0.1:{jobset_port}", ca_bundle)
                              for w in config["webhooks"]]
        out.append(config)
    for config in _load_all(components.source("kueue") / "webhook" / "manifests.yaml"):
        kept = []
        for webhook in config["webhooks"]:
            kind = webhook["name"][1:].split(".", 1)[0]
            if kind in _KUEUE_FRAMEWORK_WEBHOOKS:
                if kind not in _KUEUE_KEPT_FRAMEWORKS:
                    continue
                webhook["namespaceSelector"] = _KUEUE_NAMESPACE_SELECTOR
            kept.append(_point_at(webhook, f"https://127.0.0.1:{kueue_port}", ca_bundle))
        config["metadata"]["name"] = "kueue-" + config["metadata"]["name"]
        config["webhooks"] = kept
        out.append(config)
    return out


def conversion_webhooks(crd_objs: list[dict], *, kueue_port: int, ca_pem: bytes) -> None:
    """Kueue serves v1beta1 and v1beta2 of its queue kinds, converted by its webhook
    (its crd/kustomization.yaml patches the CRDs named there)."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    converted = {"localqueues", "clusterqueues", "cohorts", "workloads",
                 "multikueueclusters"}
    for crd in crd_objs:
        if crd["spec"]["group"] == "kueue.x-k8s.io" and crd["spec"]["names"]["plural"] in converted:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"https://127.0.0.1:{kueue_port}/convert",
                                 "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"]}}


def jobset_config(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


# Kueue v0.19 reads its metrics server's certificate from this fixed path whenever it does
# not rotate its own (cmd/kueue/main.go), even with metrics off; the cluster puts one there.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# Its on-demand visibility API is an aggregated apiserver that reads a certificate from
# /visibility, also fixed; nothing here uses it (the REST API reports the queue itself).
KUEUE_FLAGS = ("--feature-gates=VisibilityOnDemand=false",)


def kueue_config(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
    }


def namespaces() -> list[dict]:
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in (KUEUE_NAMESPACE, JOBSET_NAMESPACE)]


def segment_namespace_objects(ns: str, *, claim: str, secret: str,
                              credentials: dict[str, str]) -> list[dict]:
    """What a tenant's namespace needs before a training segment runs there: the Secret
    the pods' S3 credentials come from, and a ReadWriteMany claim for the local checkpoint
    tier, pre-bound to its own hostPath PersistentVolume (the real PV controller binds it;
    the process kubelet mounts it as one folder every node sees)."""
    volume = f"{claim}-{ns}"
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": ns},
         "stringData": dict(credentials)},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
         "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"],
                  "hostPath": {"path": f"/{volume}"}, "storageClassName": "",
                  "claimRef": {"namespace": ns, "name": claim}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": claim, "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}}},
    ]


def node_object(node: NodeSpec) -> dict:
    capacity = {"cpu": str(node.cpu), "memory": f"{node.memory_gib}Gi", "pods": "110",
                "ephemeral-storage": "100Gi"}
    if node.gpus:
        capacity["nvidia.com/gpu"] = str(node.gpus)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node.name,
        "labels": {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                   "kubernetes.io/arch": "amd64", **node.labels}},
        "status": {"capacity": capacity, "allocatable": capacity}}
