"""A rendered JobSet's pods run as nodes on this machine: the exact pod command and env
(fm_pipeline.launch.pod_local), each node in its own network namespace when a
NamespaceNetwork is given, else all on loopback.

    rendered = render_segment(SegmentLaunch(job, end_step=6), target)
    with NamespaceNetwork(2) as net:
        nodes = PodNodes(rendered, root=tmp, network=net, store_uri=str(store_dir)).start()
        nodes.wait_for_step(3); nodes.kill_node(1)      # a host lost mid-segment
        codes = nodes.wait()                            # node 0's torchrun fails too
        nodes = PodNodes(rendered, ...).start()         # the JobSet recreates every pod
        nodes.wait()                                    # resumed from the checkpoint

What differs from a cluster, and why:
  - The leader's hostname resolves to node 0's address (pod_local's `hosts`), as the
    JobSet's headless Service would make it.
  - In namespaces, per node: GLOO_SOCKET_IFNAME (gloo's interface), PET_LOCAL_ADDR
    (torchrun --local-addr: the address the agent advertises) and PET_RDZV_CONF
    is_host=1|0 (which agent serves the c10d store). The nodes share this machine's
    hostname, so torchrun cannot work these out from it as it does in a pod.
  - FM_STORE_URI points at `store_uri` (a directory, or an S3 URL the nodes can reach):
    a moto server on the host's loopback is unreachable from inside a namespace.
  - OMP_NUM_THREADS=1: one thread per rank on a shared 2-core machine.
The local checkpoint tier is the shared claim (one directory), as in the manifest:
rank 0 commits a checkpoint only after seeing every rank's files there.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

from fm_pipeline.config.worker_env import FAST_DIR_ENV
from fm_pipeline.launch.jobset import RenderedSegment
from fm_pipeline.launch.pod import FAST_VOLUME
from fm_pipeline.launch.pod_local import host_path_dir, pod_process
from fm_pipeline.resilience.netns import NamespaceNetwork
from fm_pipeline.resilience.ports import free_port
from fm_pipeline.resilience.processes import wait_for_step
from fm_pipeline.rundir.records import METRICS_FILE, read_records



class PodNodes:
    def __init__(self, rendered: RenderedSegment, *, root: Path,
                 network: NamespaceNetwork | None = None, store_uri: str | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None,
                 rdzv_conf: str = ""):
        self.rendered = rendered
        self.rdzv_conf = rdzv_conf  # extra torchrun --rdzv-conf items, "key=value,..."
        self.root = root
        self.network = network
        self.cwd = cwd
        spec = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
        self.n_nodes = spec["completions"]
        if network is not None and len(network.nodes) < self.n_nodes:
            raise ValueError(f"{self.n_nodes} nodes need as many namespaces, the network "
                             f"has {len(network.nodes)}")
        claims = [v["persistentVolumeClaim"]["claimName"]
                  for v in spec["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
        if self.n_nodes > 1 and not claims:
            raise ValueError("a multi-node segment needs its shared claim (render_segment "
                             "with shared_volume_claim)")
        self.job_name = rendered.config_map["metadata"]["labels"]["fm-pipeline/job"]
        # pod_local materializes a claim as one directory beside the nodes' own.
        self.runs_dir = root / f"pvc-{claims[0]}" / self.job_name if claims else None
        self.extra_env = {"OMP_NUM_THREADS": "1", **(env or {})}
        if store_uri is not None:
            self.extra_env.update(FM_STORE_URI=store_uri, FM_S3_ENDPOINT_URL="")
        self.port = None if network is not None else str(free_port())
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.started_at: float | None = None

    def node_env(self, index: int) -> tuple[dict[str, str], dict[str, str]]:
        """(hosts, env overrides) of node `index`."""
        fast = {} if self._fast_host_path else {FAST_DIR_ENV: str(self.fast_dir(index))}
        if self.network is None:
            return ({self.rendered.leader_host: "127.0.0.1"},
                    {**self.extra_env, **fast,
                     "PET_MASTER_PORT": self.port,
                     **({"PET_RDZV_CONF": self.rdzv_conf} if self.rdzv_conf else {})})
        node = self.network.nodes[index]
        return ({self.rendered.leader_host: self.network.nodes[0].address},
                {**self.extra_env, **fast,
                 "GLOO_SOCKET_IFNAME": node.interface,
                 "PET_LOCAL_ADDR": node.address,
                 "PET_RDZV_CONF": ",".join(filter(None, (
                     f"is_host={1 if index == 0 else 0}", self.rdzv_conf)))})

    def start(self, *, attempt: int = 0) -> PodNodes:
        """Create every node's pod. Without a hostPath the fast tier stands for the pod's
        /dev/shm, an emptyDir: a new pod starts with it empty."""
        self.started_at = time.time()
        if not self._fast_host_path:
            for i in range(self.n_nodes):
                self.wipe_node_memory(i)
        for i in range(self.n_nodes):
            self.procs.append(None)
            self.logs.append(None)
            self._start_node(i, attempt)
        return self

    def _start_node(self, i: int, attempt: int) -> None:
        hosts, overrides = self.node_env(i)
        pod = pod_process(self.rendered, node_rank=i, root=self.root, hosts=hosts,
                          env_overrides=overrides)
        argv = pod.argv if self.network is None else self.network.wrap(i, pod.argv)
        log = self.root / f"node-{i}.attempt-{attempt}.log"
        with open(log, "wb") as out:
            self.procs[i] = subprocess.Popen(argv, env=pod.env, cwd=self.cwd, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        self.logs[i] = log

    def replace_node(self, index: int, *, attempt: int = 1) -> None:
        """A spare joins in place of the lost node `index`: same pod command (the same
        completion index), nothing of the lost node's memory (its fast-tier directory is
        wiped), while the other nodes' agents keep running and rendezvous with it."""
        proc = self.procs[index]
        if proc is not None:
            try:  # a SIGKILL is delivered, not instant
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"node {index} still runs: kill_node({index}) "
                                   f"first") from None
        self.wipe_node_memory(index)
        self._start_node(index, attempt)

    @property
    def _fast_host_path(self) -> str | None:
        """The fast tier's hostPath when the pod mounts one (launch/pod.py)."""
        pod = self.rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]
        return next((v["hostPath"]["path"] for v in pod["volumes"]
                     if v["name"] == FAST_VOLUME), None)

    def fast_dir(self, index: int) -> Path:
        """The node's fast-tier memory: each node's own, as /dev/shm is on a real host (the
        pod's hostPath where it mounts one, which outlives the node's pods)."""
        node_root = self.root / f"node-{index}"
        host = self._fast_host_path
        return host_path_dir(node_root, host) if host else node_root / "shm"

    def wipe_node_memory(self, index: int) -> None:
        """The node is replaced by a new one: nothing of its memory is left."""
        shutil.rmtree(self.fast_dir(index), ignore_errors=True)

    def steps(self) -> list[dict]:
        if self.runs_dir is None:
            return []
        return [r for r in read_records(self.runs_dir / METRICS_FILE, "step")
                if r.get("time", 0) >= (self.started_at or 0)]

    def wait_for_step(self, step: int, *, timeout_s: float = 300) -> dict:
        return wait_for_step(self.steps, step, timeout_s=timeout_s,
                             alive=lambda: any(p.poll() is None for p in self.procs),
                             what=lambda: f"the nodes:\n{self.tail()}\n")

    def kill_node(self, index: int) -> list[int]:
        """SIGKILL the node's agent and workers: in a namespace every process in it, on
        loopback the pod's process group."""
        if self.network is not None:
            return self.network.kill_node(index)
        proc = self.procs[index]
        import os

        os.killpg(proc.pid, signal.SIGKILL)
        return [proc.pid]

    def worker_pid(self, index: int, rank: int) -> int:
        """The pid of global rank `rank`'s worker on node `index`: a child of the node's
        agent (torchrun starts each worker in a session of its own) with RANK set so."""
        agent = self.procs[index]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) != agent.pid:
                    continue  # fields[1]: the parent's pid (man 5 proc)
                environ = (stat.parent / "environ").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if f"RANK={rank}".encode() in environ:
                return int(stat.parent.name)
        raise LookupError(f"no worker of rank {rank} on node {index}:\n{self.tail()}")

    def wait(self, *, timeout_s: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout_s
        try:
            for p in self.procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(f"nodes still running after {timeout_s:.0f} s:\n{self.tail()}")
        return [p.returncode for p in self.procs]

    def stop(self) -> None:
        import os

        for i, p in enumerate(self.procs):
            if p.poll() is None:
                if self.network is not None:
                    self.network.kill_node(i)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def output(self, index: int) -> str:
        return self.logs[index].read_text(errors="replace")

    def tail(self, lines: int = 25) -> str:
        return "\n".join(f"--- node {i} ---\n" + "\n".join(
            self.output(i).splitlines()[-lines:]) for i in range(len(self.logs)))


def node_network(stack, n_nodes: int) -> tuple[NamespaceNetwork | None, str]:
    """(a NamespaceNetwork entered on `stack`, or None: loopback) and where the nodes run,
    in words: namespaces where this machine allows them."""
    from fm_pipeline.resilience.injectors import Unavailable
    from fm_pipeline.resilience.netns import availability

    why_not = availability()
    if why_not is None:
        try:
            return stack.enter_context(NamespaceNetwork(n_nodes)), "network namespaces"
        except Unavailable as e:
            why_not = str(e)
    return None, f"loopback ({why_not})"
