"""Pick the launcher resource from the environment: local torchrun by default, Kubernetes at scale.

    from fm_pipeline.resources.launcher import launcher_from_env
    defs = Definitions(assets=[...], resources={"launcher": launcher_from_env()})

    FM_LAUNCHER=kubernetes FM_STORE_URI=s3://bucket/fm FM_K8S_SHARED_CLAIM=fm-runs dagster dev

Environment (Kubernetes only): FM_K8S_KUBECONFIG, FM_K8S_CONTEXT, FM_K8S_IN_CLUSTER=1,
FM_K8S_NAMESPACE, FM_K8S_IMAGE, FM_K8S_SHARED_CLAIM, FM_K8S_CREDENTIALS_SECRET,
FM_K8S_SERVICE_ACCOUNT, FM_K8S_MAX_RESTARTS, FM_K8S_POLL_S (seconds between
looks at the JobSet, default 5), FM_S3_ENDPOINT_URL.
Both are SegmentLauncher (segment_launcher.py: the contract, documented once):
`launch_segment(...) -> SegmentRun` and `stop_segments(job_name, *, reason)` (checkpoint and
exit 75: the flag locally, a graceful JobSet delete).
"""

from __future__ import annotations

import os

from fm_pipeline.config.site import Site
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher
from fm_pipeline.resources.launcher_local import LocalLauncher

LAUNCHERS = ("local", "kubernetes")


def launcher_from_env(env: dict[str, str] | None = None) -> LocalLauncher | KubernetesLauncher:
    env = dict(os.environ if env is None else env)
    kind = env.get("FM_LAUNCHER", "local").strip().lower()
    if kind == "local":  # FM_LAUNCHER_ECHO=0: torchrun's output to its segment log only
        return LocalLauncher(echo_output=env.get("FM_LAUNCHER_ECHO", "1") != "0")
    if kind != "kubernetes":
        raise ValueError(f"FM_LAUNCHER={kind!r}: expected one of {', '.join(LAUNCHERS)}")
    site = Site.from_environ(env)  # the Dagster entry point: the store and its S3 service
    store_uri = site.store_uri
    if not store_uri.startswith("s3://"):
        raise ValueError("FM_LAUNCHER=kubernetes needs FM_STORE_URI=s3://bucket/prefix: pods "
                         f"share data and checkpoints through it (got {store_uri!r})")
    return KubernetesLauncher(
        store_uri=store_uri,
        kubeconfig_file=env.get("FM_K8S_KUBECONFIG") or None,
        kube_context=env.get("FM_K8S_CONTEXT") or None,
        in_cluster=env.get("FM_K8S_IN_CLUSTER", "") in ("1", "true", "yes"),
        namespace=env.get("FM_K8S_NAMESPACE") or None,
        image=env.get("FM_K8S_IMAGE") or None,
        shared_volume_claim=env.get("FM_K8S_SHARED_CLAIM") or None,
        credentials_secret=env.get("FM_K8S_CREDENTIALS_SECRET") or None,
        service_account=env.get("FM_K8S_SERVICE_ACCOUNT") or None,
        s3_endpoint_url=site.s3_endpoint,
        max_restarts=int(env.get("FM_K8S_MAX_RESTARTS", "3")),
        poll_interval_s=float(env.get("FM_K8S_POLL_S", "5")),
    )
