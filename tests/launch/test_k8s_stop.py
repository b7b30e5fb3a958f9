"""Stopping a segment that runs on Kubernetes (KubernetesLauncher.stop_segments), against the
kube-apiserver TEST DOUBLE: the JobSet is deleted in the foreground with the pods' grace
period, the "kubelet" ends the pod as on any preemption (preStop hook, SIGTERM, SIGKILL
after the grace period) while the real trainer runs in it, and the launch keeps reading the
leader's log until the pod is gone: the trainer checkpoints, exits 75, the segment is
`preempted`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
from dagster import asset, materialize
from fm_pipeline.resources.launcher_k8s import KubernetesLauncher

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.launch.jobset import RenderedSegment
from fm_pipeline.launch.pod_local import pod_process
from tests.conftest import REPO, free_port
from tests.launch.conftest import kubeconfig
from tests import local_site

NS = "training"
STEP_LINE = re.compile(r"^step (\d+):")


class Kubelet:
    """Plays the kubelet for the 1-node JobSet's pod the emulated Job controller made: runs
    its exact command and env (torchrun and the real trainer), serves its output live as
    the pod log; once the pod is deleted (the JobSet deleted, or suspended by Kueue), runs
    its preStop hook, sends SIGTERM to the command if it is still running when the hook
    returns, SIGKILL when the grace period is over; then records the exit and removes the
    pod."""

    def __init__(self, api, name: str, tmp_path, *, prestop: bool = True):
        self.api, self.name, self.tmp_path = api, name, tmp_path
        self.prestop = prestop  # False: as if the hook could not reach the trainer
        self.pod = ""
        self.steps: list[int] = []
        self.output: list[str] = []
        self.signals: list[str] = []
        self.grace_s: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        api, ns = self.api, NS
        jobset, config_map, _ = api.wait_for_segment(ns, self.name)
        rendered = RenderedSegment(name=self.name, namespace=ns, jobset=jobset,
                                   config_map=config_map)
        (pod,) = api.wait_for_pods(ns, self.name, 1)
        self.pod = pod
        node = pod_process(rendered, node_rank=0, root=self.tmp_path / "pod",
                           hosts={rendered.leader_host: "127.0.0.1"},
                           env_overrides={"PET_MASTER_PORT": str(free_port())})
        container = api.pod(ns, pod)["spec"]["containers"][0]
        api.start_pod(ns, pod)
        api.wait_for_log_reader(ns, pod)
        proc = subprocess.Popen(node.argv, env=node.env, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        pump = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        pump.start()
        try:
            self.grace_s = api.wait_for_pod_deletion(ns, pod, timeout_s=120)
            deadline = time.monotonic() + self.grace_s
            if self.prestop:
                self._run_prestop(container, node.env, proc)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                self.signals.append("SIGTERM")
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                self.signals.append("SIGKILL")
                proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            pump.join(timeout=10)
        tail = "".join(self.output)[-2048:]
        message = node.termination_log.read_text()[:4096] or (tail if proc.returncode else "")
        api.terminate_pod(ns, pod, exit_code=proc.returncode, message=message)
        api.delete_pod(ns, pod)  # the last pod: the JobSet's foreground deletion completes

    def _run_prestop(self, container: dict, env: dict, proc) -> None:
        """The hook first; SIGTERM waits for it unless the container exits meanwhile."""
        hook = subprocess.Popen(container["lifecycle"]["preStop"]["exec"]["command"], env=env)
        self.signals.append("preStop")
        while hook.poll() is None and proc.poll() is None:
            time.sleep(0.05)
        if hook.poll() is None:
            hook.kill()  # the container it ran in is gone
            hook.wait()

    def _pump(self, proc) -> None:
        for line in proc.stdout:
            self.output.append(line)
            self.api.log(NS, self.pod, line)
            match = STEP_LINE.match(line)
            if match:
                self.steps.append(int(match.group(1)))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop-preStop", "stop-SIGTERM-only", "kueue-preemption"])
def test_a_stopped_kubernetes_segment_checkpoints_and_ends_preempted(
        api, tmp_path, s3_bucket, s3_endpoint, how):
    """Stopped by the control plane (the JobSet deleted in the foreground), with the preStop
    hook reaching the trainer or only SIGTERM; or preempted by Kueue (the JobSet suspended
    again: the JobSet controller suspends its Job, the Job controller deletes the pod)."""
    api.instant_kubelet = False
    store_uri = f"s3://{s3_bucket}/fm"
    job = small_job(**{"name": "stop", "training.steps": 40, "training.segment_steps": 40,
                       "checkpoint.every_steps": 100, "training.preemption_grace_s": 5,
                       "cluster.namespace": NS})
    build_small_mix(job, store=local_site.site().open_store(store_uri))
    launcher = KubernetesLauncher(store_uri=store_uri, s3_endpoint_url=s3_endpoint,
                                  kubeconfig_file=kubeconfig(tmp_path, api),
                                  poll_interval_s=0.05, timeout_s=180)

    @asset
    def segment(context):
        # Rank 0 sleeps 0.3 s per step: time to stop it mid-segment.
        launcher.launch_segment(context, job=job, end_step=40,
                                env={"FM_FAULT_SLOW_RANKS": "0:0.3"})

    kubelet = Kubelet(api, "stop-40", tmp_path, prestop=how != "stop-SIGTERM-only")
    kubelet.thread.start()

    def control_plane():  # preempts once the trainer has stepped
        deadline = time.monotonic() + 120
        while len(kubelet.steps) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        if how == "kueue-preemption":
            api.preempt(NS, "stop-40")
            return
        control_plane.stopped = launcher.stop_segments(job.name, reason="preempt")
        control_plane.again = launcher.stop_segments(job.name, reason="preempt")

    stopper = threading.Thread(target=control_plane, daemon=True)
    stopper.start()
    result = materialize([segment], raise_on_error=False)
    stopper.join(timeout=10)
    kubelet.thread.join(timeout=30)

    ((path, options), *after) = api.delete_options
    assert path.endswith("/jobsets/stop-40")
    assert options["propagationPolicy"] == "Foreground"
    assert kubelet.grace_s == 5 + 15  # the pod template's terminationGracePeriodSeconds
    if how == "kueue-preemption":
        assert api.workloads == {} and not after  # one delete: the launcher's, after
        assert "gracePeriodSeconds" not in options or options["gracePeriodSeconds"] is None
    else:
        assert control_plane.stopped == ["stop-40"] and control_plane.again == []  # once
        assert options["gracePeriodSeconds"] == 5 + 15
    # The preStop hook's flag stops the trainer before the hook's wait ends; without it,
    # the kubelet's SIGTERM does (torchrun forwards it). Never the SIGKILL.
    assert kubelet.signals[0] == ("SIGTERM" if how == "stop-SIGTERM-only" else "preStop")
    assert "SIGKILL" not in kubelet.signals
    (failure,) = result.get_step_failure_events()
    data = failure.step_failure_data.user_failure_data
    metadata = {k: v.value for k, v in data.metadata.items()}
    assert metadata["outcome"] == "preempted" and metadata["exit_code"] == 75, data.description
    assert ("preempted by Kueue" if how == "kueue-preemption"
            else "deleted on request (preempt)") in metadata["reason"]
    stopped_at = kubelet.steps[-1]
    assert 2 <= stopped_at < 40
    manifest = json.loads(local_site.site().open_store(store_uri).get_bytes(
        f"checkpoints/stop/step-{stopped_at:08d}/manifest.json"))
    assert manifest["step"] == stopped_at  # the preemption checkpoint, in the store
    assert not api.jobsets and not api.jobs and not api.pods and not api.core  # nothing left
