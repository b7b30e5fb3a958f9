"""The few collectives checkpointing needs, also usable in a single process without a group.

Every helper is called by all ranks of `group` (the dedicated checkpoint group in the
background thread, the default group on the main thread); without torch.distributed
initialized they degrade to the obvious single-process answer.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0")) if initialized() else 0


def gather_to_rank0(obj, group=None) -> list | None:
    """Every rank's `obj` on rank 0 (in rank order), None elsewhere."""
    if not initialized():
        return [obj]
    out = [None] * dist.get_world_size(group) if rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out


def broadcast_from_rank0(obj, group=None):
    if not initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def all_gather(obj, group=None) -> list:
    if not initialized():
        return [obj]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def any_rank(flag: bool, group=None) -> bool:
    """True if `flag` is true on any rank (one tiny all-reduce)."""
    if not initialized():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def barrier(group=None) -> None:
    if initialized():
        dist.barrier(group=group)


@contextlib.contextmanager
def quiet_single_process():
    """DCP warns on every call without a process group; single-process use is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def single_threaded() -> None:
    """Thread initializer: checkpoint copies in this thread use one intra-op thread. OpenMP's
    thread count is per calling thread, so training keeps its own; without this, background
    copies spawn OpenMP teams that spin-wait against training for the same cores."""
    torch.set_num_threads(1)


@contextlib.contextmanager
def intra_op_threads(n: int):
    """This thread's intra-op thread count, for the duration of the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
