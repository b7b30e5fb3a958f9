"""Ports chosen now and bound later (the dev cluster's) come from below the kernel's
ephemeral range, where no outgoing connection's source port can take them meanwhile."""

from __future__ import annotations

import random
import socket

from fm_pipeline.resilience.ports import ephemeral_low, quiet_port


def test_a_quiet_port_is_free_and_below_the_ephemeral_range():
    low = ephemeral_low()
    assert low == int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = {quiet_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 10  # drawn, not fixed
    for port in list(ports)[:3]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free


def test_a_taken_port_is_skipped():
    with socket.socket() as taken:
        first = quiet_port(random.Random(7))
        taken.bind(("127.0.0.1", first))
        taken.listen()
        assert quiet_port(random.Random(7)) != first  # the same draw, the next free one
