"""Hosts on one machine: network namespaces joined by veth pairs to a bridge.

    with NamespaceNetwork(2) as net:                 # Unavailable (with the reason) if not
        net.nodes[0].address                         # root, no `ip`, or no netns support
        subprocess.Popen(net.wrap(0, ["torchrun", ...]))
        net.kill_node(1)                             # SIGKILL every process in node 1
    # namespaces, links and addresses are gone, even after a failure

Layout: a "switch" namespace holds a bridge; each node namespace holds one end of a veth
pair (`eth0`, 10.231.<k>.<i+1>/24, plus its own `lo`), the other end sits on the bridge.
Every link and address lives inside namespaces created here: the machine's own network is
never touched. Names carry this process's pid, so concurrent runs do not collide and
leftovers of a killed run can be recognised (`remove_stale`). The filesystem is shared by
all nodes (as a ReadWriteMany volume would be).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from dataclasses import dataclass

from fm_pipeline.launch.reaper import signal_all
from fm_pipeline.resilience.injectors import Unavailable

PREFIX = "fmchaos"
INTERFACE = "eth0"  # inside every node namespace


@dataclass(frozen=True)
class NamespaceNode:
    index: int
    namespace: str
    address: str
    interface: str = INTERFACE


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    done = _ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def namespace_pids(namespace: str) -> list[int]:
    done = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split()]


def remove_namespace(namespace: str) -> None:
    for pid in namespace_pids(namespace):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _ip("netns", "del", namespace, check=False)


def remove_stale() -> list[str]:
    """Remove namespaces left by runs whose process is gone; returns their names."""
    stale = []
    for name in namespaces():
        parts = name.split("-")
        if parts[0] == PREFIX and len(parts) >= 3 and parts[1].isdigit():
            if not os.path.exists(f"/proc/{parts[1]}"):
                remove_namespace(name)
                stale.append(name)
    return stale


def availability() -> str | None:
    """Why namespaces cannot be created here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the `ip` command is missing (apt-get install -y iproute2)"
    return None


class NamespaceNetwork:
    def __init__(self, n_nodes: int, *, subnet: int | None = None):
        if n_nodes < 1:
            raise ValueError(f"need at least one node, got {n_nodes}")
        self.tag = f"{PREFIX}-{os.getpid()}-{random.randrange(16**4):04x}"
        self.subnet = random.randrange(256) if subnet is None else subnet
        self.switch = f"{self.tag}-sw"
        self.nodes = [NamespaceNode(i, f"{self.tag}-n{i}", f"10.231.{self.subnet}.{i + 1}")
                      for i in range(n_nodes)]
        self._created: list[str] = []

    def __enter__(self) -> NamespaceNetwork:
        reason = availability()
        if reason:
            raise Unavailable(reason)
        remove_stale()
        try:
            self._create()
        except Exception as e:
            self.close()
            raise Unavailable(f"could not build the namespace network: {e}") from e
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        _ip("netns", "add", self.switch)
        self._created.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for node in self.nodes:
            _ip("netns", "add", node.namespace)
            self._created.append(node.namespace)
            port = f"p{node.index}"
            # Both ends are created inside namespaces: nothing appears in the host's.
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
                node.interface, "netns", node.namespace)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev",
                node.interface)
            _ip("-n", node.namespace, "link", "set", node.interface, "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")

    def close(self) -> None:
        for name in reversed(self._created):
            remove_namespace(name)
        self._created.clear()

    def wrap(self, index: int, argv: list[str]) -> list[str]:
        """`argv` run inside node `index`'s network namespace."""
        return ["ip", "netns", "exec", self.nodes[index].namespace, *argv]

    def kill_node(self, index: int) -> list[int]:
        """SIGKILL every process of node `index` (agent and workers): a lost host."""
        pids = namespace_pids(self.nodes[index].namespace)
        signal_all(pids, signal.SIGKILL)
        return pids
