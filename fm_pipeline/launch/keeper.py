"""The fast tier's node-level objects, rendered.

The keeper: a DaemonSet that runs `python -m fm_pipeline.checkpoint.fast_keeper` on every
node the training pods may use, on the same hostPath, and deletes the snapshots of runs
whose pods are gone for good (idle past `idle_s`). One per namespace and host path: every
job of the namespace that uses the fast tier shares it, so the client creates it when
missing and leaves it alone when it is there.

The node reader: with a rack label (`--rack-label`), each rank reads its node's failure
domain from the API (checkpoint/fast_paths.node_rack), which needs `get` on nodes for the
pods' service account: a ClusterRole and its binding, cluster-scoped, so `fm k8s render`
writes them for a cluster admin to apply once; the client does not create them.
"""

from __future__ import annotations

from fm_pipeline.checkpoint.fast_keeper import DEFAULT_IDLE_S
from fm_pipeline.launch.pod import FAST_MOUNT, FAST_VOLUME, Placement

KEEPER_NAME = "fm-fast-tier-keeper"
KEEPER_LABELS = {"app.kubernetes.io/name": "fm-pipeline",
                 "app.kubernetes.io/component": "fast-tier-keeper"}


def keeper_daemonset(*, namespace: str, image: str, host_path: str, placement: Placement,
                     idle_s: float = DEFAULT_IDLE_S) -> dict:
    pod: dict = {
        "containers": [{
            "name": "keeper",
            "image": image,
            "command": ["python", "-m", "fm_pipeline.checkpoint.fast_keeper",
                        "--root", str(FAST_MOUNT), "--idle-s", str(int(idle_s))],
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                          "limits": {"memory": "256Mi"}},
            "volumeMounts": [{"name": FAST_VOLUME, "mountPath": str(FAST_MOUNT)}],
        }],
        "volumes": [{"name": FAST_VOLUME, "hostPath": {"path": host_path,
                                                       "type": "DirectoryOrCreate"}}],
        # GPU nodes are usually tainted; the keeper must run wherever a trainer can.
        "tolerations": [{"operator": "Exists"}],
    }
    if placement.node_selector:
        pod["nodeSelector"] = dict(placement.node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": KEEPER_NAME, "namespace": namespace, "labels": dict(KEEPER_LABELS)},
        "spec": {
            "selector": {"matchLabels": dict(KEEPER_LABELS)},
            "template": {"metadata": {"labels": dict(KEEPER_LABELS)}, "spec": pod},
        },
    }


NODE_READER = "fm-node-reader"


def node_reader_rbac(*, namespace: str, service_account: str | None) -> list[dict]:
    """The ClusterRole that may get nodes, bound to the pods' service account."""
    labels = {"app.kubernetes.io/name": "fm-pipeline",
              "app.kubernetes.io/component": "node-reader"}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": NODE_READER, "labels": labels},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"{NODE_READER}-{namespace}", "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": NODE_READER},
               "subjects": [{"kind": "ServiceAccount", "name": service_account or "default",
                             "namespace": namespace}]}
    return [role, binding]
