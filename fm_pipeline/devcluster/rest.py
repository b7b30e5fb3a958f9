"""A small Kubernetes REST client for the dev cluster's own bootstrapping and its kubelet:
objects as dicts, server-side apply, the apiserver's own error messages.

    api = Rest.from_kubeconfig(path)
    api.apply(obj)                                 # PATCH application/apply-patch+yaml
    api.get("/api/v1/nodes")["items"]

The product's launcher talks to the cluster through the official `kubernetes` client; this
one exists because bootstrapping applies arbitrary kinds (CRDs, webhook configurations,
Kueue objects) and the kubelet patches pod status, both simplest as plain JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

FIELD_MANAGER = "fm-dev-cluster"
# Kinds whose objects have no namespace (everything else named here is namespaced).
CLUSTER_SCOPED = {
    "Namespace", "Node", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "PriorityClass",
    "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass", "Cohort", "Topology",
    "AdmissionCheck", "APIService", "StorageClass", "PersistentVolume",
}


class ApiError(RuntimeError):
    def __init__(self, status: int, body: dict | str, what: str):
        self.status = status
        self.body = body
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{what}: HTTP {status}: {message}")


def plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    if lower.endswith("s"):
        return lower + "es"
    return lower + "s"


def object_path(obj: dict, *, name: bool = True) -> str:
    api_version, kind = obj["apiVersion"], obj["kind"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    meta = obj["metadata"]
    if kind not in CLUSTER_SCOPED:
        base += f"/namespaces/{meta.get('namespace', 'default')}"
    base += f"/{plural(kind)}"
    return f"{base}/{meta['name']}" if name else base


@dataclass
class Rest:
    server: str
    ca: str
    cert: str
    key: str

    def __post_init__(self):
        self.session = requests.Session()
        self.session.verify = self.ca
        self.session.cert = (self.cert, self.key)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Rest:
        config = yaml.safe_load(Path(path).read_text())
        context = next(c["context"] for c in config["contexts"]
                       if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"]
                       if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        return cls(cluster["server"], cluster["certificate-authority"],
                   user["client-certificate"], user["client-key"])

    def request(self, method: str, path: str, *, body=None, params=None,
                content_type: str = "application/json", ok=(200, 201, 202),
                timeout: float = 30.0):
        data = None
        if body is not None:
            data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        # verify= per request: REQUESTS_CA_BUNDLE would otherwise override the session's.
        response = self.session.request(method, self.server + path, data=data, params=params,
                                        headers={"Content-Type": content_type},
                                        timeout=timeout, verify=self.ca)
        if response.status_code not in ok:
            try:
                detail = response.json()
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail, f"{method} {path}")
        return response.json() if response.content else None

    def get(self, path: str, **params):
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str):
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create(self, obj: dict) -> dict:
        return self.request("POST", object_path(obj, name=False), body=obj)

    def apply(self, obj: dict) -> dict:
        """Server-side apply: creates or updates, the apiserver's validation and the
        admission webhooks run as for any client."""
        return self.request("PATCH", object_path(obj), body=json.dumps(obj),
                            params={"fieldManager": FIELD_MANAGER, "force": "true"},
                            content_type="application/apply-patch+yaml")

    def patch_status(self, obj_path: str, patch: dict) -> dict:
        return self.request("PATCH", obj_path + "/status", body=patch,
                            content_type="application/merge-patch+json")

    def merge_patch(self, obj_path: str, patch: dict) -> dict:
        return self.request("PATCH", obj_path, body=patch,
                            content_type="application/merge-patch+json")

    def delete(self, obj_path: str, *, grace_period_s: int | None = None,
               propagation: str | None = None) -> bool:
        body: dict = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        if propagation:
            body["propagationPolicy"] = propagation
        try:
            self.request("DELETE", obj_path, body=body)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise
