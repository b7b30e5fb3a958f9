"""One rank's in-memory snapshot: its local shards of every checkpoint part, as bytes.

    tensors, skeleton = split_state(live)          # live = {part: part.state_dict()}
    payload = encode(host_copies, skeleton)        # torch.save bytes (tensors + structure)
    apply_snapshot(app_state, payload)             # copy into the live tensors, then
                                                   # load_state_dict, as dcp.load does

A snapshot is only ever restored on the topology that wrote it (the fast tier checks), so a
DTensor is saved as its local shard and loaded back into the same shard; no resharding and
no collective is needed to write or read one. Loading follows DCP's protocol: the values
are copied into the tensors `state_dict()` returned, then every part's `load_state_dict`
gets the filled dict (the optimizer's fresh state, the loader's cursor, the RNG).
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed.tensor import DTensor

_TENSOR = "__fm_tensor__"  # a tensor's place in the skeleton: {_TENSOR: path}


class SnapshotMismatch(ValueError):
    """The snapshot's structure is not this rank's state (another model or topology)."""


def split_state(state: Any, originals: dict | None = None) -> tuple[dict[str, torch.Tensor], Any]:
    """(path -> local tensor, the structure with each tensor replaced by its path).
    `originals`, when given, receives path -> the tensor itself (a DTensor stays one)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(obj, where):
        if isinstance(obj, torch.Tensor):
            tensors[where] = obj.to_local() if isinstance(obj, DTensor) else obj
            if originals is not None:
                originals[where] = obj
            return {_TENSOR: where}
        if isinstance(obj, dict):
            return {k: walk(v, f"{where}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            out = [walk(v, f"{where}/{i}") for i, v in enumerate(obj)]
            return out if isinstance(obj, list) else tuple(out)
        return obj

    return tensors, walk(state, "")


def encode(tensors: dict[str, torch.Tensor], skeleton: Any) -> bytes:
    buf = io.BytesIO()
    torch.save({"tensors": tensors, "skeleton": skeleton}, buf)
    return buf.getbuffer().tobytes()


def decode(payload: bytes | memoryview) -> tuple[dict[str, torch.Tensor], Any]:
    data = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    return data["tensors"], data["skeleton"]


def _rebuild(skeleton: Any, live: dict[str, torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if set(skeleton) == {_TENSOR}:
            return live[skeleton[_TENSOR]]
        return {k: _rebuild(v, live) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_rebuild(v, live) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(_rebuild(v, live) for v in skeleton)
    return skeleton


def apply_snapshot(app_state: dict, payload: bytes | memoryview) -> None:
    """Load a snapshot into the Stateful parts of `app_state` (this rank only). Raises
    SnapshotMismatch, naming the first difference, before anything is overwritten."""
    saved, skeleton = decode(payload)
    live_state = {k: v.state_dict() if hasattr(v, "state_dict") else v
                  for k, v in app_state.items()}
    originals: dict[str, torch.Tensor] = {}
    live, _ = split_state(live_state, originals)
    if set(saved) != set(live):
        extra, missing = sorted(set(saved) - set(live)), sorted(set(live) - set(saved))
        raise SnapshotMismatch(f"snapshot tensors differ from this rank's: it has {extra[:3]} "
                               f"that the rank lacks and lacks {missing[:3]}")
    for key, tensor in live.items():
        value = saved[key]
        if value.shape != tensor.shape or value.dtype != tensor.dtype:
            raise SnapshotMismatch(f"{key}: snapshot has {value.dtype} {list(value.shape)}, "
                                   f"this rank {tensor.dtype} {list(tensor.shape)}")
    with torch.no_grad():
        for key, tensor in live.items():
            tensor.copy_(saved[key])
    # The saved structure with the live tensors (now filled, DTensors as such) in place.
    filled = _rebuild(skeleton, originals)
    for key, part in app_state.items():
        if hasattr(part, "load_state_dict"):
            part.load_state_dict(filled[key])
