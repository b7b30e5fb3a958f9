"""The launcher resources inside a Dagster asset: Pipes results from rank 0, real failure
reasons as dagster.Failure metadata; locally with torchrun, on Kubernetes against the
kube-apiserver TEST DOUBLE (kube_api_double.py)."""

from __future__ import annotations

import subprocess
import threading

import pytest
from dagster import Field, Permissive, asset, materialize
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher
from fm_pipeline.resources.launcher_local import LocalLauncher

from fm_pipeline.launch.jobset import RenderedSegment
from fm_pipeline.launch.pod_local import pod_process
from tests.conftest import REPO, free_port
from tests.launch.conftest import TINY_WORKER, kubeconfig, tiny_job

NS = "training"
JOB = tiny_job(nnodes=1, nproc=2, cluster={"namespace": NS})


@asset(required_resource_keys={"launcher"},
       config_schema={"env": Field(Permissive(), default_value={})})
def segment(context):
    run = context.resources.launcher.launch_segment(context, job=JOB, end_step=5,
                                                    env=context.op_config["env"])
    return run.materialize_result()


def _with_env(**env) -> dict:
    """Run config: `env` reaches every worker (locally) or every pod (Kubernetes)."""
    return {"ops": {"segment": {"config": {"env": env}}}}


def _failure_metadata(result) -> dict:
    (event,) = result.get_step_failure_events()
    data = event.step_failure_data.user_failure_data
    return {k: v.value for k, v in data.metadata.items()}, data.description


@pytest.mark.slow
def test_local_launcher_returns_what_rank_0_reported_through_pipes():
    result = materialize([segment], run_config=_with_env(FM_TINY_WORKER="pipes"), resources={
        "launcher": LocalLauncher(trainer_module=TINY_WORKER, echo_output=False)})
    assert result.success
    (mat,) = result.asset_materializations_for_node("segment")
    metadata = {k: v.value for k, v in mat.metadata.items()}
    assert metadata["end_step"] == 5  # sent by rank 0 over Pipes
    assert metadata["outcome"] == "succeeded"  # added by the launcher


@pytest.mark.slow
def test_local_launcher_failure_carries_the_real_exit_code(monkeypatch):
    monkeypatch.setenv("FM_TINY_WORKER", "bad_config")
    result = materialize([segment], raise_on_error=False, resources={
        "launcher": LocalLauncher(trainer_module=TINY_WORKER, echo_output=False)})
    assert not result.success
    metadata, description = _failure_metadata(result)
    assert metadata["outcome"] == "bad_config" and metadata["exit_code"] == 2
    assert "seq_len 4096" in description and "exit code 2" in description


def _run_pod_like_the_kubelet(api, name: str, *, behaviours: list, tmp_path,
                              pods: list[str]) -> None:
    """Play the kubelet for a 1-node JobSet, one restart attempt per behaviour (None: as the
    submitted pod env says): start the pod the emulated Job controller made, run its exact
    command and env (torchrun and all) here, serve its output as the pod log, end the pod
    as the kubelet would (the message file, else the log tail on error). A failure fails
    the Job and the JobSet controller's failure policy restarts it (attempt + 1) or fails
    the JobSet; `pods` gets each attempt's pod name."""
    jobset, config_map, _ = api.wait_for_segment(NS, name)
    rendered = RenderedSegment(name=name, namespace=NS, jobset=jobset, config_map=config_map)
    for attempt, behaviour in enumerate(behaviours):
        node = pod_process(rendered, node_rank=0, root=tmp_path / f"pods-{attempt}",
                           hosts={rendered.leader_host: "127.0.0.1"},
                           env_overrides={"PET_MASTER_PORT": str(free_port())})
        (pod,) = api.wait_for_pods(NS, name, 1, attempt=attempt)
        pods.append(pod)
        api.start_pod(NS, pod)
        api.wait_for_log_reader(NS, pod)
        worker_env = {**node.env, **({"FM_TINY_WORKER": behaviour} if behaviour else {})}
        out = subprocess.run(node.argv, env=worker_env,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=120)
        api.log(NS, pod, out.stdout)
        # The kubelet: the message file if anything was written to it, else on error the
        # log tail (terminationMessagePolicy FallbackToLogsOnError).
        message = node.termination_log.read_text()[:4096] or (
            out.stdout[-2048:] if out.returncode else "")
        api.terminate_pod(NS, pod, exit_code=out.returncode, message=message)
        if out.returncode == 0:
            return


def _k8s_launcher(tmp_path, api, **settings) -> KubernetesLauncher:
    return KubernetesLauncher(store_uri="s3://fm-bucket/fm", **settings,
                              kubeconfig_file=kubeconfig(tmp_path, api),
                              trainer_module=TINY_WORKER, poll_interval_s=0.05, timeout_s=120)


@pytest.mark.slow
def test_kubernetes_launcher_reattaches_to_the_new_leader_and_reads_its_pipes(api, tmp_path):
    pods: list[str] = []
    kubelet = threading.Thread(target=_run_pod_like_the_kubelet, daemon=True,
                               kwargs=dict(api=api, name="tiny-5", behaviours=["crash", "pipes"],
                                           tmp_path=tmp_path, pods=pods))
    kubelet.start()
    result = materialize([segment], resources={"launcher": _k8s_launcher(tmp_path, api)})
    kubelet.join(timeout=30)
    assert result.success
    (mat,) = result.asset_materializations_for_node("segment")
    assert mat.metadata["end_step"].value == 5  # rank 0's Pipes message, from pod a1's log
    assert mat.metadata["outcome"].value == "succeeded"
    assert "after 1 JobSet restart" in mat.metadata["reason"].value
    logs = [path for method, path, _ in api.requests if path.endswith("/log")]
    first, second = pods  # the Job controller's: <jobset>-node-0-0-<random>, per attempt
    assert first.startswith("tiny-5-node-0-0-") and second.startswith("tiny-5-node-0-0-")
    assert [p.split("/")[-2] for p in logs][-1] == second
    assert any(p.split("/")[-2] == first for p in logs)
    assert not api.jobsets and not api.core  # deleted once complete


@pytest.mark.slow
def test_kubernetes_launcher_failure_names_the_workers_reason(api, tmp_path):
    pods: list[str] = []
    kubelet = threading.Thread(target=_run_pod_like_the_kubelet, daemon=True,
                               kwargs=dict(api=api, name="tiny-5", behaviours=[None],
                                           tmp_path=tmp_path, pods=pods))
    kubelet.start()
    result = materialize([segment], raise_on_error=False,
                         run_config=_with_env(FM_TINY_WORKER="bad_config"),
                         resources={"launcher": _k8s_launcher(tmp_path, api, max_restarts=0)})
    kubelet.join(timeout=30)
    metadata, description = _failure_metadata(result)
    # torchrun's container exit code is 1; the worker's 2 and its reason come from the
    # termination message (the worker's exit record, written to the message file).
    assert metadata["outcome"] == "bad_config" and metadata["exit_code"] == 2
    assert "seq_len 4096" in description
    assert metadata["evidence"] == f"pod {pods[0]} termination message"
    assert not api.jobsets
