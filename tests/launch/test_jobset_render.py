"""Rendered Kubernetes objects: strictly valid, the local torchrun command, Kueue and placement."""

from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

from fm_pipeline.cli.k8s import app as k8s_app
from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_validate import ManifestInvalid, validate_object
from fm_pipeline.launch.local import segment_command
from fm_pipeline.launch.pod import Placement
from fm_pipeline.launch.spec import SegmentLaunch
from tests.launch.conftest import tiny_job
from tests import local_site

STORE = "s3://fm-bucket/fm"
CLAIM = "fm-runs"  # a ReadWriteMany volume: the local checkpoint tier of every node


def _target(**settings) -> KubernetesTarget:
    return KubernetesTarget(store_uri=STORE, shared_volume_claim=CLAIM, **settings)


def _container(rendered) -> dict:
    spec = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec["containers"][0]


def _env(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture
def two_nodes():
    return tiny_job(nnodes=2, nproc=2, priority="high",
                    cluster={"local_queue": "team-a", "namespace": "training"})


def test_every_rendered_object_is_strictly_valid(two_nodes):
    rendered = render_segment(SegmentLaunch(two_nodes, end_step=20),
                              _target())
    kinds = [o["kind"] for o in rendered.objects()]
    # No Service: the JobSet controller creates the headless one from spec.network.
    assert kinds == ["ConfigMap", "JobSet"]
    for obj in rendered.objects():
        validate_object(obj)
        assert obj["metadata"]["namespace"] == "training"
    assert yaml.safe_load(rendered.config_map["data"]["job.yaml"])["name"] == "tiny"
    assert rendered.jobset["spec"]["network"] == {
        "enableDNSHostnames": True, "subdomain": rendered.name, "publishNotReadyAddresses": True}
    assert rendered.leader_host.endswith(f".{rendered.name}")


RENDEZVOUS_FLAGS = {"--standalone": 0, "--nnodes": 1, "--nproc-per-node": 1, "--node-rank": 1,
                    "--rdzv-backend": 1, "--rdzv-endpoint": 1, "--rdzv-id": 1}


def _without_rendezvous_and_paths(argv: list[str]) -> list[str]:
    """torchrun's own flags and the trainer's, with rendezvous dropped and paths blanked."""
    i = next(n for n, arg in enumerate(argv) if arg.startswith("--"))  # past the executable
    kept = []
    while i < len(argv):
        arg = argv[i]
        if arg in RENDEZVOUS_FLAGS:
            i += 1 + RENDEZVOUS_FLAGS[arg]
        elif arg in ("--log-dir", "--job"):
            kept += [arg, "<path>"]
            i += 2
        else:
            kept.append(arg)
            i += 1
    return kept


def test_the_pod_runs_the_local_command_with_only_the_rendezvous_changed(two_nodes, tmp_path):
    launch = SegmentLaunch(two_nodes, end_step=20, overrides=("training.lr=0.001",))
    container = _container(render_segment(launch, _target()))
    local_argv, _ = segment_command(launch, local_site.site(), tmp_path / "seg")
    pod = container["command"]
    assert pod[0] == "torchrun"
    assert _without_rendezvous_and_paths(pod) == _without_rendezvous_and_paths(local_argv)
    assert pod[-4:] == ["--end-step", "20", "--set", "training.lr=0.001"]
    assert pod[pod.index("--rdzv-endpoint") + 1] == "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"
    assert local_argv[local_argv.index("--nproc-per-node") + 1] == "4"  # all ranks locally
    env = _env(container)
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_MASTER_ADDR"] == "tiny-20-node-0-0.tiny-20"
    assert "job-completion-index" in env["PET_NODE_RANK"]["fieldRef"]["fieldPath"]
    assert env["FM_STORE_URI"] == STORE and env["TORCHELASTIC_ERROR_FILE"]


def test_kueue_queue_priority_and_failure_policy(two_nodes):
    js = render_segment(SegmentLaunch(two_nodes, end_step=20),
                        _target(max_restarts=5)).jobset
    labels = js["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "fm-high"
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 5
    node_loss = policy["rules"][0]
    assert node_loss["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["completions"] == job["parallelism"] == 2 and job["backoffLimit"] == 0
    # The Job controller's message for this rule is what the JobSet rule matches.
    assert job["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["type"] == "DisruptionTarget"
    assert "DisruptionTarget" in node_loss["onJobFailureMessagePatterns"][0]


def test_prestop_touches_the_preemption_flag_within_the_grace_period(two_nodes):
    rendered = render_segment(SegmentLaunch(two_nodes, end_step=20),
                              _target())
    container = _container(rendered)
    pod_spec = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    hook = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert 'touch "$FM_PREEMPT_FILE"' in hook
    grace = two_nodes.training.preemption_grace_s
    assert pod_spec["terminationGracePeriodSeconds"] > grace
    assert _env(container)["FM_PREEMPT_FILE"].startswith("/var/lib/fm/")
    # Checkpoints land on the shared claim; torchrun's error files stay on the pod's disk.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/var/lib/fm/runs"] == "runs" and mounts["/var/lib/fm"] == "state"
    claims = [v for v in pod_spec["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "runs", "persistentVolumeClaim": {"claimName": CLAIM}}]


def test_gpu_jobs_request_gpus_and_placement_reaches_kueue_and_jobset():
    job = tiny_job(nnodes=2, nproc=8, cluster={"accelerator": "h100"},
                   training={"global_batch_size": 32})
    placement = Placement(required_topology="cloud.provider.com/topology-block",
                          exclusive_topology="cloud.provider.com/topology-rack",
                          avoid_hosts=("gpu-node-17",))
    rendered = render_segment(SegmentLaunch(job, end_step=20),
                              _target(placement=placement))
    container = _container(rendered)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    template = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-block"}
    assert rendered.jobset["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.provider.com/topology-rack"}
    terms = template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["gpu-node-17"]


def test_a_broken_object_is_refused_with_the_field_named(two_nodes):
    rendered = render_segment(SegmentLaunch(two_nodes, end_step=20),
                              _target())
    broken = copy.deepcopy(rendered.jobset)
    broken["spec"]["failurePolicy"]["restartStrategy"] = "Sometimes"
    with pytest.raises(ManifestInvalid, match=r"spec\.failurePolicy\.restartStrategy"):
        validate_object(broken)
    broken = copy.deepcopy(rendered.jobset)
    pod = broken["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["termintionGracePeriod"] = 5
    with pytest.raises(ManifestInvalid, match="containers.0.*'termintionGracePeriod'"):
        validate_object(broken)
    broken = copy.deepcopy(rendered.jobset)
    broken["spec"]["network"]["publishNotReady"] = True
    with pytest.raises(ManifestInvalid, match="'publishNotReady' was unexpected"):
        validate_object(broken)


def test_render_refuses_what_pods_cannot_run(two_nodes):
    with pytest.raises(ValueError, match="shared object store"):
        KubernetesTarget(store_uri="/tmp/local-store")
    no_upload = tiny_job(nnodes=2, nproc=2, checkpoint={"upload": False})
    with pytest.raises(ValueError, match="without shared_volume_claim needs checkpoint.upload"):
        render_segment(SegmentLaunch(no_upload, end_step=20), KubernetesTarget(store_uri=STORE))
    with pytest.raises(ValueError, match=r"pod hostname .* \(max 63\)"):
        render_segment(SegmentLaunch(two_nodes, end_step=20),
                       _target(name="x" * 60))
    with pytest.raises(ValueError, match="unknown accelerator 'tpu-v9'"):
        render_segment(SegmentLaunch(tiny_job(cluster={"accelerator": "tpu-v9"}), end_step=20),
                       _target())


def test_multi_node_without_a_shared_claim_keeps_each_nodes_tier_on_its_own_disk(two_nodes):
    """The checkpoint commit is collective and each node uploads its own files, so nodes need
    no shared volume: without a claim no PVC is mounted and the pods still validate."""
    rendered = render_segment(SegmentLaunch(two_nodes, end_step=20),
                              KubernetesTarget(store_uri=STORE))
    pod = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    with_claim = render_segment(SegmentLaunch(two_nodes, end_step=20), _target())
    pod = with_claim.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
            if "persistentVolumeClaim" in v] == [CLAIM]


def test_cli_writes_manifests_that_validate(tmp_path, two_nodes):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(SegmentLaunch(two_nodes, end_step=20).job_yaml())
    out = tmp_path / "manifests"
    result = CliRunner().invoke(k8s_app, ["render", "--job", str(job_file), "--out", str(out),
                                          "--store-uri", STORE, "--shared-volume-claim", CLAIM,
                                          "--set", "training.steps=80"])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in out.iterdir())
    assert files == ["configmap-tiny-20-job.yaml", "jobset-tiny-20.yaml"]
    for path in out.iterdir():
        validate_object(yaml.safe_load(path.read_text()))
    spec = yaml.safe_load(yaml.safe_load((out / "configmap-tiny-20-job.yaml").read_text())
                          ["data"]["job.yaml"])
    assert spec["training"]["steps"] == 80


def test_cli_invalid_job_spec_writes_no_manifest(tmp_path):
    job_file = tmp_path / "bad.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": "bad", "parallelism": {"nproc_per_node": 3, "tp": 2},
        "data": {"sources": [{"name": "a", "uri": "python-stdlib", "weight": 1.0}]},
    }))
    out = tmp_path / "manifests"
    result = CliRunner().invoke(k8s_app, ["render", "--job", str(job_file), "--out", str(out),
                                          "--store-uri", STORE])
    assert result.exit_code == 2
    assert "parallelism" in result.output and "world size 3" in result.output
    assert not out.exists()
    result = CliRunner().invoke(k8s_app, ["render", "--job", str(job_file), "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_a_chosen_checkpoint_reaches_the_trainer_as_resume_from(two_nodes, tmp_path):
    chosen = "s3://fm-test/runs/checkpoints/tiny/step-00000010"
    launch = SegmentLaunch(two_nodes, end_step=20, resume_from=chosen)
    pod = _container(render_segment(launch, _target()))["command"]
    local_argv, _ = segment_command(launch, local_site.site(), tmp_path / "seg")
    for argv in (pod, local_argv):
        assert argv[-4:] == ["--end-step", "20", "--resume-from", chosen]
    assert "--resume-from" not in segment_command(
        SegmentLaunch(two_nodes, end_step=20), local_site.site(), tmp_path / "other")[0]


def test_the_fast_tier_lives_in_node_memory_that_outlives_the_pods_with_its_keeper():
    """With checkpoint.memory_every_steps the snapshots go to a hostPath in node memory (a
    pod's /dev/shm dies with it: a JobSet restart would find nothing) and a keeper
    DaemonSet on the same path bounds what stays there; without the fast tier neither."""
    job = tiny_job(nnodes=2, nproc=2, checkpoint={"memory_every_steps": 2},
                   cluster={"namespace": "training"})
    rendered = render_segment(SegmentLaunch(job, end_step=20),
                              _target(placement=Placement(node_selector={"pool": "h100"})))
    container = _container(rendered)
    pod = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (fast,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert fast["hostPath"] == {"path": "/dev/shm/fm-fast-tier", "type": "DirectoryOrCreate"}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == fast["name"]]
    assert _env(container)["FM_FAST_TIER_DIR"] == mount["mountPath"]
    assert [o["kind"] for o in rendered.objects()] == ["ConfigMap", "JobSet", "DaemonSet"]
    keeper = rendered.keeper
    validate_object(keeper)
    assert keeper["metadata"]["namespace"] == "training"
    keeper_pod = keeper["spec"]["template"]["spec"]
    assert keeper_pod["volumes"][0]["hostPath"]["path"] == "/dev/shm/fm-fast-tier"
    assert keeper_pod["nodeSelector"] == {"pool": "h100"}  # wherever the trainers may run
    command = keeper_pod["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "fm_pipeline.checkpoint.fast_keeper"]
    assert command[command.index("--root") + 1] == mount["mountPath"]

    # The pod's own /dev/shm instead (worker restarts only), by choice: no keeper.
    plain = render_segment(SegmentLaunch(job, end_step=20), _target(fast_tier_host_path=""))
    assert plain.keeper is None and "FM_FAST_TIER_DIR" not in _env(_container(plain))
    assert not [v for v in _container(plain)["volumeMounts"] if v["name"] == "fast-tier"]
    off = render_segment(SegmentLaunch(tiny_job(nnodes=2, nproc=2), end_step=20), _target())
    assert off.keeper is None
    with pytest.raises(ValueError, match="absolute path on the node"):
        _target(fast_tier_host_path="fm-fast")


def test_a_rack_label_reaches_the_ranks_with_the_rbac_to_read_it(tmp_path):
    """With --rack-label the pods learn their node (downward API) and the label key; the
    ClusterRole that lets them get nodes is written beside the objects for an admin, and
    is not among what the client creates. A key the API server would refuse is refused."""
    job = tiny_job(nnodes=2, nproc=2, checkpoint={"memory_every_steps": 2},
                   cluster={"namespace": "training"})
    rendered = render_segment(SegmentLaunch(job, end_step=20), _target(
        rack_label="topology.kubernetes.io/zone", service_account="trainer"))
    env = _env(_container(rendered))
    assert env["FM_RACK_LABEL"] == "topology.kubernetes.io/zone"
    assert env["FM_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    role, binding = rendered.cluster_rbac
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer",
                                    "namespace": "training"}]
    for obj in rendered.cluster_rbac:
        validate_object(obj)
    assert not any(o["kind"].startswith("ClusterRole") for o in rendered.objects())
    written = sorted(p.name for p in rendered.write(tmp_path))
    assert "clusterrole-fm-node-reader.yaml" in written
    assert "clusterrolebinding-fm-node-reader-training.yaml" in written
    plain = render_segment(SegmentLaunch(job, end_step=20), _target())
    assert "FM_RACK_LABEL" not in _env(_container(plain)) and not plain.cluster_rbac
    with pytest.raises(ValueError, match="not a node label key"):
        _target(rack_label="rack label")
