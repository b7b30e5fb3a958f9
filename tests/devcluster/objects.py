"""What a tenant's namespace needs before a training segment can run there: the S3
credentials Secret and a ReadWriteMany claim for the local checkpoint tier (bound by the
real PV controller; the process kubelet mounts it as one folder every node sees)."""

from __future__ import annotations

CLAIM, SECRET = "fm-runs", "s3-credentials"


def shared_claim(kube, ns: str) -> str:
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": f"fm-runs-{ns}"},
                "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"],
                         "hostPath": {"path": f"/fm-runs-{ns}"}, "storageClassName": "",
                         "claimRef": {"namespace": ns, "name": CLAIM}}})
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": CLAIM, "namespace": ns},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                         "volumeName": f"fm-runs-{ns}",
                         "resources": {"requests": {"storage": "1Gi"}}}})
    return CLAIM


def credentials(kube, ns: str) -> str:
    kube.apply({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": SECRET, "namespace": ns},
                "stringData": {"AWS_ACCESS_KEY_ID": "testing",
                               "AWS_SECRET_ACCESS_KEY": "testing",
                               "AWS_DEFAULT_REGION": "us-east-1"}})
    return SECRET
