"""The pod a training node runs in: the segment's torchrun command plus what a pod needs.

What the pod adds around the command: the PET_* rendezvous env (node rank from the Indexed
Job's completion index), the job spec from a ConfigMap, a scratch volume for torchrun's
error files, a shared claim for the local checkpoint tier, /dev/shm, GPUs, and the preemption
handshake: preStop touches the trainer's flag file and waits out the grace period, so
ranks agree on a step, checkpoint and exit before the kubelet sends SIGTERM.

With the fast tier on (checkpoint.memory_every_steps > 0) its snapshots go to a hostPath
directory in the node's memory (FAST_HOST_PATH, a tmpfs on the node): a pod's own /dev/shm
is an emptyDir and dies with the pod, so a JobSet restart (every pod recreated) would find
nothing, while the node's directory outlives the pods. The node keeper DaemonSet
(launch/keeper.py) bounds what stays there once a job is gone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from fm_pipeline.accelerators import get_accelerator
from fm_pipeline.config.worker_env import (
    FAST_DIR_ENV,
    NODE_NAME_ENV,
    PREEMPT_FILE_ENV,
    RACK_LABEL_ENV,
    TERMINATION_LOG_ENV,
)
from fm_pipeline.launch.spec import SegmentLaunch, SegmentPaths

CONTAINER = "trainer"
SPEC_MOUNT = PurePosixPath("/etc/fm")
STATE_MOUNT = PurePosixPath("/var/lib/fm")  # FM_HOME inside the pod (emptyDir)
RUNS_MOUNT = STATE_MOUNT / "runs"  # runs_dir(): the local checkpoint tier (shared volume)
FAST_MOUNT = PurePosixPath("/var/lib/fm-fast")  # the fast tier's node memory, in the pod
FAST_HOST_PATH = "/dev/shm/fm-fast-tier"  # on the node: tmpfs that outlives the pods
FAST_VOLUME = "fast-tier"
RDZV_PORT = 29500
TERMINATION_LOG = "/dev/termination-log"  # the kubelet's default terminationMessagePath
# Seconds after the preStop wait before the kubelet's SIGKILL: torchrun forwards SIGTERM
# and the trainer exits at its next step boundary.
KILL_MARGIN_S = 15


def pod_paths() -> SegmentPaths:
    return SegmentPaths(
        job_file=SPEC_MOUNT / "job.yaml",
        log_dir=STATE_MOUNT / "torchrun",
        error_file=STATE_MOUNT / "error.json",
        preempt_flag=STATE_MOUNT / "preempt",
    )


@dataclass(frozen=True)
class Placement:
    """Where the pods may land, from the plan's rank placement.

    required/preferred_topology: a node label key (e.g. `cloud.provider.com/topology-block`)
    that Kueue's topology-aware scheduling must/should keep every pod of the job within.
    exclusive_topology: JobSet exclusive placement: one job per domain of this label key.
    avoid_hosts: hostnames never to use again (e.g. a straggler excluded by the policy).
    """

    required_topology: str | None = None
    preferred_topology: str | None = None
    exclusive_topology: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    avoid_hosts: tuple[str, ...] = ()

    def __post_init__(self):
        if self.required_topology and self.preferred_topology:
            raise ValueError(
                "placement: set required_topology or preferred_topology, not both "
                f"(got {self.required_topology!r} and {self.preferred_topology!r})"
            )

    def pod_annotations(self) -> dict[str, str]:
        if self.required_topology:
            return {"kueue.x-k8s.io/podset-required-topology": self.required_topology}
        if self.preferred_topology:
            return {"kueue.x-k8s.io/podset-preferred-topology": self.preferred_topology}
        return {}

    def affinity(self) -> dict | None:
        if not self.avoid_hosts:
            return None
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                      "values": list(self.avoid_hosts)}]}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}}


def is_gpu(accelerator: str) -> bool:
    """True for catalog GPUs; raises ValueError naming the known ones for anything else."""
    if accelerator.lower() == "cpu":
        return False
    get_accelerator(accelerator)
    return True


def env_list(values: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in values.items()]


def trainer_container(
    launch: SegmentLaunch, *, image: str, master_addr: str, env: dict[str, str],
    master_port: int = RDZV_PORT, fast_tier_host_path: str | None = FAST_HOST_PATH,
    rack_label: str | None = None,
) -> dict:
    """`fast_tier_host_path`: the node directory the fast tier keeps its snapshots in; None
    or empty keeps them in the pod's /dev/shm (they then survive worker restarts only).
    `rack_label`: the node label naming its failure domain, for the fast tier's replicas."""
    job = launch.job
    paths = pod_paths()
    grace = math.ceil(job.training.preemption_grace_s)
    pet = [
        {"name": "PET_NNODES", "value": str(job.parallelism.nnodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(job.parallelism.nproc_per_node)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "PET_MASTER_ADDR", "value": master_addr},
        {"name": "PET_MASTER_PORT", "value": str(master_port)},
    ]
    base_env = {
        "FM_HOME": str(STATE_MOUNT),
        TERMINATION_LOG_ENV: TERMINATION_LOG,
        "PYTHONUNBUFFERED": "1",
        **paths.env(),
        **env,
    }
    mounts = [
        {"name": "job-spec", "mountPath": str(SPEC_MOUNT), "readOnly": True},
        {"name": "state", "mountPath": str(STATE_MOUNT)},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if fast_tier_host_path and job.checkpoint.memory_every_steps > 0:
        base_env[FAST_DIR_ENV] = str(FAST_MOUNT)
        mounts.append({"name": FAST_VOLUME, "mountPath": str(FAST_MOUNT)})
    if rack_label and job.checkpoint.memory_every_steps > 0:
        base_env[RACK_LABEL_ENV] = rack_label
        pet.append({"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": "spec.nodeName"}}})
    if is_gpu(job.cluster.accelerator):
        resources = {"limits": {"nvidia.com/gpu": str(job.parallelism.nproc_per_node)}}
    else:
        resources = {"requests": {"cpu": str(job.parallelism.nproc_per_node)}}
    return {
        "name": CONTAINER,
        "image": image,
        "command": launch.torchrun_argv(launch.pet_rendezvous(), paths=paths),
        "env": pet + env_list(base_env),
        "ports": [{"name": "rdzv", "containerPort": master_port, "protocol": "TCP"}],
        "resources": resources,
        "lifecycle": {"preStop": {"exec": {"command": [
            "/bin/sh", "-c", f'touch "${PREEMPT_FILE_ENV}"; sleep {grace}',
        ]}}},
        # A worker that exits on purpose writes its record to the message file; otherwise
        # the kubelet keeps the log tail (torchrun's failure summary).
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }


def pod_template(
    launch: SegmentLaunch, *, container: dict, config_map: str, placement: Placement,
    labels: dict[str, str], service_account: str | None = None,
    shared_volume_claim: str | None = None, fast_tier_host_path: str | None = None,
) -> dict:
    grace = math.ceil(launch.job.training.preemption_grace_s)
    spec: dict = {
        "restartPolicy": "Never",  # the JobSet failure policy restarts, never the kubelet
        "terminationGracePeriodSeconds": grace + KILL_MARGIN_S,
        "containers": [container],
        "volumes": [
            {"name": "job-spec", "configMap": {"name": config_map}},
            {"name": "state", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if shared_volume_claim:
        spec["volumes"].append({"name": "runs", "persistentVolumeClaim": {
            "claimName": shared_volume_claim}})
        container["volumeMounts"].append({"name": "runs", "mountPath": str(RUNS_MOUNT)})
    if any(m["name"] == FAST_VOLUME for m in container["volumeMounts"]):
        # DirectoryOrCreate: the first pod on a node makes it (root-owned, in node memory).
        spec["volumes"].append({"name": FAST_VOLUME, "hostPath": {
            "path": fast_tier_host_path or FAST_HOST_PATH, "type": "DirectoryOrCreate"}})
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    affinity = placement.affinity()
    if affinity:
        spec["affinity"] = affinity
    if service_account:
        spec["serviceAccountName"] = service_account
    metadata: dict = {"labels": labels}
    annotations = placement.pod_annotations()
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}
