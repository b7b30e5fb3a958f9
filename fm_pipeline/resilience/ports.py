"""Free TCP ports on 127.0.0.1 for servers a fault scenario or the dev cluster starts.

`free_port` is the kernel's pick: another process may take it before the server binds,
which start-up errors then name. `quiet_port` is for a port chosen now and bound many
seconds later (the dev cluster picks its components' ports before it starts etcd and binds
Kueue's half a minute on): a port below the kernel's ephemeral range, which no outgoing
connection takes as its source port meanwhile (those, and bind(0), draw from that range;
a busy machine opens thousands, and CI once lost Kueue's webhook port to one).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
QUIET_SPAN = 12000  # how far below the ephemeral range quiet ports are drawn from


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def quiet_port(rng: random.Random | None = None) -> int:
    """A free port below the ephemeral range, drawn at random (two callers rarely meet)."""
    rng = rng or random.SystemRandom()
    high = ephemeral_low() - 1
    low = max(1024, high - QUIET_SPAN)
    for _ in range(200):
        port = rng.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on 127.0.0.1 in {low}-{high} after 200 tries")
