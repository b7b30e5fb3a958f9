"""The data mix past one machine: data_mix_job_k8s, each step a Kubernetes Job made by
dagster-k8s's k8s_job_executor (the run itself launched by the deployment's K8sRunLauncher).

    rendered = render_data_job(spec, DataK8sTarget(store_uri="s3://bucket/fm"))
    rendered.write(out)   # configmap-<job>-data-spec.yaml, data-run-config.yaml, data-step-job.yaml

The Job a step becomes, built by the executor's own construct_dagster_k8s_job from the run
config, is validated strictly like the training manifests (k8s_validate); the run config
itself is checked against k8s_job_executor's config schema by the data area
(assets.data.k8s.check_k8s_run_config). `fm k8s render-data` writes nothing when either fails. The steps read the job spec
from a ConfigMap mounted at /etc/fm and write to the object store, so every step of any
node sees the same objects; each step's memory is bounded by its task (data.task_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from fm_pipeline.config import JobSpec, dump_job
from fm_pipeline.launch.k8s_validate import validate_all

SPEC_DIR = "/etc/fm"
SPEC_FILE = "job.yaml"


@dataclass(frozen=True)
class DataK8sTarget:
    store_uri: str  # s3://bucket/prefix: what every step pod reads and writes
    image: str | None = None  # default: cluster.image
    namespace: str | None = None  # default: cluster.namespace
    s3_endpoint_url: str | None = None
    credentials_secret: str | None = None  # a Secret with AWS_* keys, as env
    step_cpu: str = "1"
    step_memory: str = "4Gi"  # a task's input (data.task_bytes) and its intermediates
    service_account: str = "fm-dagster"  # deploy/instance.py's K8sRunLauncher default
    instance_config_map: str = "fm-dagster-instance"
    dagster_home: str = "/opt/dagster/dagster_home"


@dataclass
class RenderedData:
    name: str
    namespace: str
    config_map: dict
    run_config: dict
    step_job: dict  # what one step becomes (clean_file_group), for review

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        files = {f"configmap-{self.config_map['metadata']['name']}.yaml": self.config_map,
                 "data-run-config.yaml": self.run_config, "data-step-job.yaml": self.step_job}
        paths = []
        for name, obj in files.items():
            path = out / name
            path.write_text(yaml.safe_dump(obj, sort_keys=False))
            paths.append(path)
        return paths


def render_data_job(spec: JobSpec, target: DataK8sTarget) -> RenderedData:
    if not target.store_uri.startswith("s3://"):
        raise ValueError(f"--store-uri must be s3://bucket/prefix for step pods on many nodes, "
                         f"got {target.store_uri!r}")
    namespace = target.namespace or spec.cluster.namespace
    image = target.image or spec.cluster.image
    name = f"{spec.name}-data-spec"
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": name, "namespace": namespace,
                               "labels": {"app.kubernetes.io/part-of": "fm-pipeline"}},
                  "data": {SPEC_FILE: yaml.safe_dump(dump_job(spec), sort_keys=False)}}
    env = [{"name": "FM_STORE_URI", "value": target.store_uri}]
    if target.s3_endpoint_url:
        env.append({"name": "FM_S3_ENDPOINT_URL", "value": target.s3_endpoint_url})
    container = {
        "env": env,
        "resources": {"requests": {"cpu": target.step_cpu, "memory": target.step_memory},
                      "limits": {"memory": target.step_memory}},
        "volume_mounts": [{"name": "job-spec", "mount_path": SPEC_DIR, "read_only": True}],
    }
    if target.credentials_secret:
        container["env_from"] = [{"secret_ref": {"name": target.credentials_secret}}]
    step_k8s_config = {"container_config": container,
                       "pod_spec_config": {"volumes": [{"name": "job-spec",
                                                        "config_map": {"name": name}}]}}
    run_config = {
        "execution": {"config": {
            "job_namespace": namespace, "job_image": image, "image_pull_policy": "IfNotPresent",
            "service_account_name": target.service_account,
            "max_concurrent": spec.data.workers, "step_k8s_config": step_k8s_config}},
        "resources": {
            "job_spec": {"config": {"path": f"{SPEC_DIR}/{SPEC_FILE}"}},
            "store": {"config": {"uri": target.store_uri,
                                 "endpoint_url": target.s3_endpoint_url}}},
    }
    step_job = _step_job(run_config, target, image=image, namespace=namespace)
    validate_all([config_map, step_job])
    return RenderedData(name=name, namespace=namespace, config_map=config_map,
                        run_config=run_config, step_job=step_job)


def _step_job(run_config: dict, target: DataK8sTarget, *, image: str, namespace: str) -> dict:
    """The Job k8s_job_executor makes of a step: its construct_dagster_k8s_job with the
    executor's step config (the run id and step are placeholders)."""
    from dagster_k8s.job import (
        DagsterK8sJobConfig,
        UserDefinedDagsterK8sConfig,
        construct_dagster_k8s_job,
    )
    from kubernetes.client import ApiClient

    executor = run_config["execution"]["config"]
    job_config = DagsterK8sJobConfig(
        job_image=image, dagster_home=target.dagster_home, image_pull_policy="IfNotPresent",
        service_account_name=target.service_account,
        instance_config_map=target.instance_config_map)
    job = construct_dagster_k8s_job(
        job_config=job_config,
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-clean-file-group",
        user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(executor["step_k8s_config"]),
        component="step_worker",
        labels={"dagster/job": "data_mix_job_k8s", "dagster/op": "clean_file_group"},
        env_vars=[{"name": "DAGSTER_RUN_JOB_NAME", "value": "data_mix_job_k8s"},
                  {"name": "DAGSTER_RUN_STEP_KEY", "value": "clean_documents.clean_file_group"}])
    manifest = ApiClient().sanitize_for_serialization(job)
    manifest.setdefault("apiVersion", "batch/v1")
    manifest.setdefault("kind", "Job")
    manifest["metadata"]["namespace"] = namespace
    return manifest
