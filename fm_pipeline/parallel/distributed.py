"""Process-group start-up that runs unchanged on CPU (gloo) and GPU (NCCL).

Under torchrun the rendezvous comes from its environment (RANK, WORLD_SIZE, MASTER_ADDR...);
started as a plain `python` process it becomes a world of one on a free loopback port.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def device_and_backend() -> tuple[torch.device, str]:
    """The accelerator if there is one (NCCL), else the CPU (gloo)."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(*, timeout_s: float = 600.0) -> torch.device:
    """Join (or create) the default process group; returns this rank's device."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    device, backend = device_and_backend()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None,
                                **_attempt_store(timedelta(seconds=timeout_s)))
    return device


def _attempt_store(timeout: timedelta) -> dict:
    """Under torchrun's shared rendezvous store, a store of this restart attempt's own.

    The c10d rendezvous keeps one TCPStore server for the agent's life and hands it to the
    workers of every restart attempt without a prefix (torch/distributed/rendezvous.py:
    "We create a new TCPStore for every retry" no longer holds since the store is shared,
    dynamic_rendezvous.py), so after an in-job restart gloo read the dead workers' addresses
    and failed with "connectFullMesh ... Connection refused" (pytorch/pytorch#167288).
    Prefixing the keys with the attempt gives each attempt a clean namespace."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
    return {"store": dist.PrefixStore(f"fm/attempt_{attempt}", store),
            "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}


def world() -> tuple[int, int]:
    """(rank, world_size) of the default group."""
    return dist.get_rank(), dist.get_world_size()
