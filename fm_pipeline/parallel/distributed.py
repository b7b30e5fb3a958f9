"""Process-group start-up that runs unchanged on CPU (gloo) and GPU (NCCL).

Under torchrun the rendezvous comes from its environment (RANK, WORLD_SIZE, MASTER_ADDR...);
started as a plain `python` process it becomes a world of one on a free loopback port.
"""

from __future__ import annotations

import gc
import os
import socket
import time
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
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    ranks = {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    if _rejoined:  # an in-process restart: the store every rank kept, a namespace of its own
        generation, store = _rejoined["generation"], _rejoined["store"]
        return {"store": dist.PrefixStore(f"fm/attempt_{attempt}/inproc_{generation}", store),
                **ranks}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
    return {"store": dist.PrefixStore(f"fm/attempt_{attempt}", store), **ranks}


def _drop_dtensor_caches() -> None:
    """DTensor's caches (sharding propagation in Python and C++, the redistribute planners,
    mesh topology) hold DeviceMeshes and so their process groups after the model is gone; a
    group alive keeps its connections open, and a peer blocked on it would wait out the
    collective timeout instead of failing at once."""
    from torch.distributed.tensor import _collective_utils, _redistribute, _sharding_prop
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    _sharding_prop.ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    _redistribute._gen_transform_infos.cache_clear()
    _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()
    gc.collect()


# In-process restarts of this process (train.inprocess): the store kept from the first
# group, and the generation (also in rundir.attempts.INPROCESS_ENV, read without torch).
_rejoined: dict = {}


def leave_and_meet(*, wait_s: float) -> bool:
    """An in-process restart's rendezvous, after a failure escaped the training loop: tear
    down every process group of this process (gloo closes its connections once nothing
    holds a group, so a peer blocked on this rank fails at once and comes here too), then
    wait on the store the groups were made from until every rank has arrived. True:
    init_distributed joins a new group in a namespace of its own. False: some rank did not
    come within `wait_s` (its process died: torchrun's restart of the workers takes over)."""
    store = _rejoined.get("store") or dist.distributed_c10d._get_default_store()
    world = dist.get_world_size()
    _drop_dtensor_caches()
    dist.destroy_process_group()
    generation = _rejoined.get("generation", 0) + 1
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"fm/attempt_{attempt}/inproc_{generation}/arrived"
    store.add(key, 1)
    deadline = time.monotonic() + wait_s
    while int(store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    _rejoined.update(store=store, generation=generation)
    from fm_pipeline.rundir.attempts import INPROCESS_ENV

    os.environ[INPROCESS_ENV] = str(generation)
    return True


def world() -> tuple[int, int]:
    """(rank, world_size) of the default group."""
    return dist.get_rank(), dist.get_world_size()
