"""Segment lifecycle times on the real Kubernetes controllers, beside the local launcher's.

    python -m benchmarks.k8s [--repeats 3]

The dev cluster (fm_pipeline/devcluster: kube-apiserver, controller-manager, scheduler,
etcd, the JobSet and Kueue managers built from the pinned Go modules, the process
kubelet) on this machine, an S3 endpoint (moto's server) holding the data mix and the
checkpoints, and the real trainer (tiny model, 2 nodes x 2 CPU ranks, rank 0 sleeping
0.3 s a step so there is time to act). Each figure is the median of `--repeats` runs,
with its spread (max - min) in "spread"; all times are this machine's clock, read from
the trainer's step records (metrics.jsonl "time": a step's end) and the benchmark's own
observations of the JobSet (polled every 0.1 s):

  submit_to_first_step_s    KubernetesLauncher.launch_segment called -> rank 0's first
                            step done (render, submit, Kueue admission, JobSet controller,
                            scheduler, pods started, torchrun rendezvous, trainer start)
  kill_to_resumed_step_s    every process of the node-rank-1 pod SIGKILLed (a lost node)
                            after the step-4 checkpoint -> the first step done after it
                            (Job failed, JobSet restart, new pods, restore)
  evict_to_checkpoint_s     Kueue suspends the low-priority job's JobSet (a high-priority
                            job of another tenant reclaims its quota) -> the checkpoint
                            the trainer commits on the preStop flag (manifest created_at)
  readmit_to_resumed_step_s the resumed segment's JobSet, queued behind the high job,
                            unsuspended by Kueue -> its first step done

The local launcher, same run, same job (the 4 ranks under one torchrun on this machine),
same slow step:
  submit_to_first_step_s    LocalLauncher.launch_segment called -> first step done
  kill_to_resumed_step_s    ranks 2 and 3 SIGKILLed after the step-4 checkpoint -> the
                            first step after torchrun restarted the workers (one restart
                            allowed, durable restore: no fast tier on either side)
  evict_to_checkpoint_s     the preemption flag set (stop_segments) -> committed checkpoint
  readmit_to_resumed_step_s the resumed segment launched -> its first step done (nothing
                            queues locally: this is the launch and restore alone)

Last stdout line: one JSON object (real_controllers, the components' versions, medians
per launcher, spreads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

console = Console(stderr=True)
SLOW_STEP = "0:0.3"
POLL_S = 0.1
# Four CPUs in the cohort, two guaranteed to each tenant: a 2x2 research job borrows
# prod's two, a 1x2 prod job within its quota takes them back (Kueue evicts).
TENANTS = {"pool": {"gpu": 4, "cpu": 4}, "launcher": "kubernetes", "admission": "kueue",
           "tenants": [
               {"name": "research", "quota": {"gpu": 2, "cpu": 2}, "priorities": ["low"]},
               {"name": "prod", "quota": {"gpu": 2, "cpu": 2}, "priorities": ["high"]}],
           "preemption": {"max_per_job_per_hour": 10, "grace_s": 20}}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}  # moto's: any will do
METRICS = ("submit_to_first_step_s", "kill_to_resumed_step_s", "evict_to_checkpoint_s",
           "readmit_to_resumed_step_s")


class Bench:
    def __init__(self, root: Path, cluster, kube, store, store_uri: str, s3: str):
        self.root, self.cluster, self.kube = root, cluster, kube
        self.store, self.store_uri, self.s3 = store, store_uri, s3

    # -- jobs and launchers ------------------------------------------------------------

    def job(self, name: str, *, ns: str, nnodes: int, steps: int, every: int,
            priority: str, restarts: int = 0):
        from fm_pipeline.data.testing import small_job

        return small_job(**{"name": name, "parallelism.nnodes": nnodes,
                            "parallelism.nproc_per_node": 2, "training.steps": steps,
                            "training.segment_steps": steps, "checkpoint.every_steps": every,
                            "cluster.namespace": ns, "cluster.local_queue": ns,
                            "tenant": ns, "priority": priority,
                            "resilience.inplace_restarts": restarts,
                            "resilience.inprocess_restart": False})

    def kubernetes(self, **settings):
        from fm_pipeline.resources.launcher_k8s import KubernetesLauncher

        return KubernetesLauncher(store_uri=self.store_uri, s3_endpoint_url=self.s3,
                                  kubeconfig_file=self.cluster.kubeconfig,
                                  credentials_secret="s3-credentials",
                                  shared_volume_claim="fm-runs", poll_interval_s=0.5,
                                  **settings)

    def local(self):
        from fm_pipeline.resources.launcher_local import LocalLauncher

        return LocalLauncher(echo_output=False)

    def segment(self, launcher, job, end_step: int) -> Segment:
        return Segment(launcher, job, end_step)

    # -- what happened -----------------------------------------------------------------

    def steps(self, job, *, kubernetes: bool) -> list[dict]:
        from fm_pipeline.config.site import Site

        runs = (Path(self.cluster.state) / "claims" / job.cluster.namespace / "fm-runs"
                if kubernetes else Site.from_environ().runs_dir(job.name).parent)
        path = runs / job.name / "metrics.jsonl"
        records = []
        for line in path.read_text().splitlines() if path.is_file() else []:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("kind") == "step":
                    records.append(record)
        return records

    def wait(self, what: str, predicate, timeout_s: float = 300.0):
        deadline = time.monotonic() + timeout_s
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout_s:g} s")
            time.sleep(POLL_S)
        return value

    def first_step_after(self, job, t: float, *, kubernetes: bool) -> float:
        return self.wait(f"{job.name}: a step after {t}", lambda: next(
            (r["time"] for r in self.steps(job, kubernetes=kubernetes) if r["time"] > t),
            None))

    def committed(self, job, step: int) -> float:
        key = f"checkpoints/{job.name}/step-{step:08d}/manifest.json"
        self.wait(f"{key} committed", lambda: self.store.exists(key))
        created = json.loads(self.store.get_bytes(key))["created_at"]
        return datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()

    def suspended(self, name: str, ns: str) -> bool | None:
        """The JobSet's spec.suspend (Kueue's hold); None while there is no JobSet."""
        obj = self.kube.get_or_none(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/"
                                    f"jobsets/{name}")
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        return bool(obj["spec"].get("suspend"))

    def when(self, what: str, predicate) -> float:
        self.wait(what, predicate)
        return time.time()

    # -- scenarios ---------------------------------------------------------------------

    def evict_and_readmit(self, i: int, *, kubernetes: bool) -> dict[str, float]:
        """A low job trains; a high job takes its quota (Kueue evicts) or its flag is set
        (local); the low job's next segment resumes once it is admitted again."""
        tag = "k" if kubernetes else "l"
        low = self.job(f"bk-low-{tag}{i}", ns="research", nnodes=2, steps=60, every=1000,
                       priority="low")
        high = self.job(f"bk-high-{tag}{i}", ns="prod", nnodes=1, steps=20, every=1000,
                        priority="high")
        launcher = self.kubernetes() if kubernetes else self.local()
        out = {}
        first = self.segment(launcher, low, 60)
        first_step = self.first_step_after(low, 0, kubernetes=kubernetes)
        out["submit_to_first_step_s"] = first_step - first.called
        self.wait("three steps", lambda: len(self.steps(low, kubernetes=kubernetes)) >= 3)
        if kubernetes:
            name = f"{low.name}-60"
            taker = self.segment(self.kubernetes(), high, 20)
            evicted = self.when("Kueue's eviction", lambda: self.suspended(name, "research"))
            first.join()  # the trainer checkpointed and exited 75; the JobSet is deleted
            at = self.steps(low, kubernetes=True)[-1]["step"]
            out["evict_to_checkpoint_s"] = self.committed(low, at) - evicted
            # The next segment, as the failure sensor would launch it: queued behind the
            # high job until Kueue readmits it.
            resumed = self.segment(self.kubernetes(), low, 60)
            self.wait("the resumed JobSet", lambda: self.suspended(name, "research")
                      is not None)
            readmitted = self.when("Kueue's readmission",
                                   lambda: self.suspended(name, "research") is False)
            taker.join()
        else:
            flagged = self.when("the flag set", lambda: launcher.stop_segments(
                low.name, reason="preempt"))
            first.join()
            at = self.steps(low, kubernetes=False)[-1]["step"]
            out["evict_to_checkpoint_s"] = self.committed(low, at) - flagged
            resumed = self.segment(self.local(), low, 60)
            readmitted = resumed.called
        out["readmit_to_resumed_step_s"] = self.first_step_after(
            low, readmitted, kubernetes=kubernetes) - readmitted
        resumed.join()
        return out

    def kill(self, i: int, *, kubernetes: bool) -> float:
        tag = "k" if kubernetes else "l"
        job = self.job(f"bk-kill-{tag}{i}", ns="prod", nnodes=2, steps=14, every=4,
                       priority="high", restarts=0 if kubernetes else 1)
        launcher = self.kubernetes(max_restarts=2) if kubernetes else self.local()
        segment = self.segment(launcher, job, 14)
        self.committed(job, 4)
        before = self.steps(job, kubernetes=kubernetes)[-1]["segment"]
        killed = time.time()
        if kubernetes:
            _kill_pod(self.kube, f"{job.name}-14", "prod", node_rank=1)
        else:
            _kill_ranks(ranks=(2, 3))
        # The first step of the restarted workers (a new trainer process: a new segment
        # id; a step the killed attempt finished as the kill landed is not one).
        resumed = self.wait("the resumed step", lambda: next(
            (r["time"] for r in self.steps(job, kubernetes=kubernetes)
             if r["time"] > killed and r["segment"] != before), None))
        segment.join()
        return resumed - killed


class Segment:
    """A segment materialized in a thread (Dagster's in-process executor), from now."""

    def __init__(self, launcher, job, end_step: int):
        from dagster import asset, materialize

        @asset(required_resource_keys={"launcher"})
        def segment(context):
            return context.resources.launcher.launch_segment(
                context, job=job, end_step=end_step).materialize_result()

        self.job = job
        self.called = time.time()
        self.thread = threading.Thread(target=lambda: materialize(
            [segment], resources={"launcher": launcher}, raise_on_error=False), daemon=True)
        self.thread.start()

    def join(self, timeout_s: float = 600) -> None:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise TimeoutError(f"segment {self.job.name} still running after {timeout_s:g} s")


def _kill_pod(kube, jobset: str, ns: str, *, node_rank: int) -> None:
    from fm_pipeline.devcluster.kubelet import lose_pod

    (pod,) = [p for p in kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=(
        f"jobset.sigs.k8s.io/jobset-name={jobset},"
        f"batch.kubernetes.io/job-completion-index={node_rank}"))["items"]
        if p["status"].get("phase") == "Running"]
    lose_pod(pod["metadata"]["uid"])


def _kill_ranks(*, ranks: tuple[int, ...]) -> None:
    """SIGKILL the local segment's workers of these global ranks (one segment runs)."""
    from fm_pipeline.launch.reaper import tagged

    wanted = {str(r).encode() for r in ranks}
    for pid in tagged():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(pair.startswith(b"RANK=") and pair[5:] in wanted for pair in environ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _summary(rows: list[dict]) -> tuple[dict, dict]:
    med, spread = {}, {}
    for key in METRICS:
        values = [r[key] for r in rows]
        med[key] = round(statistics.median(values), 3)
        spread[key] = round(max(values) - min(values), 3)
    return med, spread


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fm-k8s-bench-"))
    os.environ.update({"FM_HOME": str(root / "home"), "FM_LAUNCHER_ECHO": "0",
                       "MLFLOW_LOGGING_LEVEL": "WARNING", "FM_FAULT_SLOW_RANKS": SLOW_STEP,
                       "FM_CPU_PEAKS_FILE": os.environ.get("FM_CPU_PEAKS_FILE",
                                                           str(root / "cpu-peaks.json")),
                       **CREDENTIALS})
    import boto3
    from moto.server import ThreadedMotoServer

    from fm_pipeline.config.site import Site
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.devcluster.build import build_components, default_cache
    from fm_pipeline.devcluster.cluster import DevCluster, default_nodes
    from fm_pipeline.devcluster.rest import Rest
    from fm_pipeline.resilience.ports import free_port
    from fm_pipeline.scheduling import parse_tenants
    from fm_pipeline.defaults import DEV_CLUSTER_TENANTS
    import yaml

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    components = build_components(default_cache(), log=lambda line: console.print(line))
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    s3 = f"http://127.0.0.1:{port}"
    os.environ["FM_S3_ENDPOINT_URL"] = s3
    boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket="bench")
    store_uri = "s3://bench/fm"
    site = Site.from_environ().with_store(store_uri, s3_endpoint=s3)
    store = site.store()
    os.environ["FM_STORE_URI"] = store_uri
    build_small_mix(small_job(), store=store)
    tenants = parse_tenants({**yaml.safe_load(DEV_CLUSTER_TENANTS.read_text()), **TENANTS})
    dev = DevCluster(components, root / "cluster", nodes=default_nodes(2), tenants=tenants,
                     image_env={"FM_FAULT_SLOW_RANKS": SLOW_STEP,
                                "FM_CPU_PEAKS_FILE": os.environ["FM_CPU_PEAKS_FILE"]})
    rows: dict[str, list[dict]] = {"kubernetes": [], "local": []}
    try:
        cluster = dev.up()
        kube = Rest.from_kubeconfig(Path(cluster.kubeconfig))
        _namespace_objects(kube)
        bench = Bench(root, cluster, kube, store, store_uri, s3)
        with Progress(console=console) as progress:
            task = progress.add_task("k8s and local segment lifecycles",
                                     total=args.repeats * 2)
            for i in range(args.repeats):
                for launcher in ("kubernetes", "local"):
                    on_k8s = launcher == "kubernetes"
                    row = bench.evict_and_readmit(i, kubernetes=on_k8s)
                    row["kill_to_resumed_step_s"] = bench.kill(i, kubernetes=on_k8s)
                    rows[launcher].append({k: round(v, 3) for k, v in row.items()})
                    console.print(f"{launcher} {i}: {row}")
                    progress.advance(task)
    finally:
        dev.down()
        moto.stop()
    k8s, k8s_spread = _summary(rows["kubernetes"])
    local, local_spread = _summary(rows["local"])
    result = {"benchmark": "k8s", "real_controllers": True, "repeats": args.repeats,
              "versions": cluster.versions, "kubernetes": k8s, "local": local,
              "spread": {"kubernetes": k8s_spread, "local": local_spread},
              "world": "2 nodes x 2 CPU ranks (local: 4 ranks under one torchrun)",
              "slow_step": SLOW_STEP, "runs": rows}
    print(json.dumps(result))
    return result


def _namespace_objects(kube) -> None:
    from fm_pipeline.devcluster.manifests import segment_namespace_objects

    for ns in ("research", "prod"):
        for obj in segment_namespace_objects(ns, claim="fm-runs", secret="s3-credentials",
                                             credentials=CREDENTIALS):
            kube.apply(obj)


if __name__ == "__main__":
    main()
