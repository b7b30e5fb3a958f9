"""What a tenant's namespace needs before a training segment can run there
(devcluster.manifests.segment_namespace_objects), applied with the tests' S3 credentials."""

from __future__ import annotations

from fm_pipeline.devcluster.manifests import segment_namespace_objects

CLAIM, SECRET = "fm-runs", "s3-credentials"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def prepare_namespace(kube, ns: str) -> tuple[str, str]:
    """Applies them; returns (claim, secret)."""
    for obj in segment_namespace_objects(ns, claim=CLAIM, secret=SECRET,
                                         credentials=CREDENTIALS):
        kube.apply(obj)
    return CLAIM, SECRET
