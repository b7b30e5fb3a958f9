"""A free TCP port on 127.0.0.1 for a server a fault scenario starts (the kernel's pick;
another process may take it before the server binds, which start-up errors then name)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
