"""Render a training segment as Kubernetes objects: a ConfigMap and a JobSet (whose
controller creates the headless Service the pods' DNS names need).

    fm k8s render --job configs/demo.yaml --out manifests/ --store-uri s3://bucket/fm

    rendered = render_segment(SegmentLaunch(job, end_step=20),
                              KubernetesTarget(store_uri="s3://bucket/fm"))
    rendered.write(Path("manifests"))   # every object validated strictly first

One replicated job "node" (an Indexed Job, one pod per node), queued by Kueue with the
job's LocalQueue and WorkloadPriorityClass. Failure policy: any failed pod fails its Job
(backoffLimit 0); a pod that lost its node or was evicted (condition DisruptionTarget)
restarts the whole JobSet without using up the restart budget; any other failure restarts
it at most `max_restarts` times. Every restart resumes from the latest valid checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fm_pipeline.launch.k8s_validate import label_key_errors, validate_object
from fm_pipeline.launch.keeper import keeper_daemonset, node_reader_rbac
from fm_pipeline.launch.pod import (
    FAST_HOST_PATH,
    RDZV_PORT,
    Placement,
    pod_template,
    trainer_container,
)
from fm_pipeline.launch.spec import SegmentLaunch

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "node"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
EXCLUSIVE_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
MAX_HOSTNAME = 63


def priority_class_name(priority: str) -> str:
    """The Kueue WorkloadPriorityClass for a job priority (low/normal/high/urgent)."""
    return f"fm-{priority}"


@dataclass(frozen=True)
class KubernetesTarget:
    """Where and how the segment's pods run; the job spec's `cluster` section fills the gaps.

    store_uri: the object store every node shares for data and checkpoints (s3://...).
    shared_volume_claim: optional ReadWriteMany PersistentVolumeClaim mounted at FM_HOME/runs,
        a local checkpoint tier shared by all nodes. Without it each node keeps its own ranks'
        files and the checkpoint commit is collective (fm_pipeline.checkpoint.commit); the
        object store then holds the only whole copy, so checkpoint.upload must be on.
    credentials_secret: a Secret whose keys (AWS_ACCESS_KEY_ID, ...) become pod env.
    extra_env: added to every pod (the Dagster Pipes bootstrap variables, for one).
    fast_tier_host_path: the node directory (hostPath, in node memory) of the fast tier's
        snapshots when checkpoint.memory_every_steps > 0, so that they outlive a JobSet
        restart; empty keeps them in the pod's /dev/shm (worker restarts only). Namespaces
        whose Pod Security level is baseline or restricted refuse hostPath volumes.
    rack_label: a node label naming the node's failure domain (rack, block, zone), read by
        each rank so that the fast tier's replicas go to another one; render writes the
        ClusterRole that lets the pods get nodes (launch/keeper.py).
    """

    store_uri: str
    s3_endpoint_url: str | None = None
    shared_volume_claim: str | None = None
    credentials_secret: str | None = None
    image: str | None = None
    namespace: str | None = None
    name: str | None = None
    max_restarts: int = 3
    master_port: int = RDZV_PORT
    service_account: str | None = None
    placement: Placement = field(default_factory=Placement)
    extra_env: dict[str, str] = field(default_factory=dict)
    fast_tier_host_path: str = FAST_HOST_PATH
    rack_label: str = ""

    def __post_init__(self):
        if not self.store_uri.startswith("s3://"):
            raise ValueError(
                f"store_uri {self.store_uri!r}: pods on different nodes need a shared object "
                "store for data and checkpoints; use s3://bucket/prefix (fm k8s render "
                "--store-uri, or FM_STORE_URI)"
            )
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.rack_label and (why := label_key_errors(self.rack_label)):
            raise ValueError(f"rack_label {self.rack_label!r}: not a node label key: {why}")
        if self.fast_tier_host_path and not self.fast_tier_host_path.startswith("/"):
            raise ValueError(f"fast_tier_host_path {self.fast_tier_host_path!r}: a hostPath "
                             "is an absolute path on the node (or empty for the pod's /dev/shm)")


@dataclass(frozen=True)
class RenderedSegment:
    name: str
    namespace: str
    config_map: dict
    jobset: dict
    keeper: dict | None = None  # the fast tier's node keeper DaemonSet (launch/keeper.py)
    cluster_rbac: tuple[dict, ...] = ()  # for a cluster admin to apply; never the client's

    def objects(self) -> list[dict]:
        """What the client creates, in order. No Service: the JobSet controller creates the
        headless Service of `spec.network.subdomain` itself (jobset_controller.go,
        createHeadlessSvcIfNecessary), owned by the JobSet; one created beside it would
        race it into a 409."""
        return [self.config_map, self.jobset, *([self.keeper] if self.keeper else [])]

    def written(self) -> list[dict]:
        """What `write` puts in the directory: the objects and the cluster-scoped RBAC."""
        return [*self.objects(), *self.cluster_rbac]

    @property
    def leader_host(self) -> str:
        return f"{self.name}-{REPLICATED_JOB}-0-0.{self.name}"

    def write(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for obj in self.written():
            path = out_dir / f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
            path.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
            written.append(path)
        return written


def render_segment(launch: SegmentLaunch, target: KubernetesTarget) -> RenderedSegment:
    """Build and strictly validate the objects; raises ValueError/ManifestInvalid, never
    returns a manifest the API server would refuse."""
    job = launch.job
    name = target.name or launch.rdzv_id
    namespace = target.namespace or job.cluster.namespace
    nnodes = job.parallelism.nnodes
    if nnodes > 1 and not target.shared_volume_claim and not job.checkpoint.upload:
        raise ValueError(
            f"a {nnodes}-node job without shared_volume_claim needs checkpoint.upload=true: "
            "each node keeps only its own ranks' checkpoint files, so the object store holds "
            "the only whole copy to resume from"
        )
    last_host = f"{name}-{REPLICATED_JOB}-0-{nnodes - 1}"
    if len(last_host) > MAX_HOSTNAME:
        raise ValueError(
            f"JobSet name {name!r} is too long: pod hostname {last_host!r} has "
            f"{len(last_host)} characters (max {MAX_HOSTNAME}); use a shorter name"
        )
    labels = {
        "app.kubernetes.io/name": "fm-pipeline",
        "app.kubernetes.io/component": "training-segment",
        "fm-pipeline/job": job.name,
        "fm-pipeline/end-step": str(launch.end_step),
    }
    config_map_name = f"{name}-job"
    env = {"FM_STORE_URI": target.store_uri}
    if target.s3_endpoint_url:
        env["FM_S3_ENDPOINT_URL"] = target.s3_endpoint_url
    env.update(target.extra_env)
    container = trainer_container(
        launch, image=target.image or job.cluster.image,
        master_addr=f"{name}-{REPLICATED_JOB}-0-0.{name}", env=env,
        master_port=target.master_port, fast_tier_host_path=target.fast_tier_host_path,
        rack_label=target.rack_label,
    )
    if target.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": target.credentials_secret}}]
    template = pod_template(
        launch, container=container, config_map=config_map_name,
        placement=target.placement, labels=dict(labels), service_account=target.service_account,
        shared_volume_claim=target.shared_volume_claim,
        fast_tier_host_path=target.fast_tier_host_path,
    )
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name, "namespace": namespace, "labels": dict(labels)},
        "data": {"job.yaml": launch.job_yaml()},
    }
    jobset = _jobset(launch, target, name=name, namespace=namespace, labels=labels,
                     template=template)
    keeper = None
    if target.fast_tier_host_path and job.checkpoint.memory_every_steps > 0:
        keeper = keeper_daemonset(namespace=namespace, image=target.image or job.cluster.image,
                                  host_path=target.fast_tier_host_path,
                                  placement=target.placement)
    rbac = ()
    if target.rack_label and job.checkpoint.memory_every_steps > 0:
        rbac = tuple(node_reader_rbac(namespace=namespace,
                                      service_account=target.service_account))
    rendered = RenderedSegment(name=name, namespace=namespace, config_map=config_map,
                               jobset=jobset, keeper=keeper, cluster_rbac=rbac)
    for obj in rendered.written():
        validate_object(obj)
    return rendered


def _jobset(launch: SegmentLaunch, target: KubernetesTarget, *, name: str, namespace: str,
            labels: dict[str, str], template: dict) -> dict:
    job = launch.job
    nnodes = job.parallelism.nnodes
    metadata: dict = {
        "name": name,
        "namespace": namespace,
        "labels": {
            **labels,
            QUEUE_LABEL: job.cluster.local_queue,
            PRIORITY_LABEL: priority_class_name(job.priority),
        },
    }
    if target.placement.exclusive_topology:
        metadata["annotations"] = {EXCLUSIVE_ANNOTATION: target.placement.exclusive_topology}
    job_spec = {
        "parallelism": nnodes,
        "completions": nnodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # one failed pod fails the Job; the JobSet decides what next
        "podFailurePolicy": {"rules": [{
            "action": "FailJob",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }]},
        "template": template,
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            # The controller's headless Service for this subdomain; DNS records are
            # published before pods are Ready: the rendezvous starts before readiness.
            "network": {"enableDNSHostnames": True, "subdomain": name,
                        "publishNotReadyAddresses": True},
            "failurePolicy": {
                "maxRestarts": target.max_restarts,
                # Old pods are gone before new ones start: no stale rank joins the rendezvous.
                "restartStrategy": "BlockingRecreate",
                "rules": [{
                    "name": "NodeLostOrEvicted",
                    "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "onJobFailureMessagePatterns": ["has condition DisruptionTarget"],
                }],
            },
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [{
                "name": "node",
                "replicas": 1,
                "template": {"metadata": {"labels": dict(labels)}, "spec": job_spec},
            }],
        },
    }
