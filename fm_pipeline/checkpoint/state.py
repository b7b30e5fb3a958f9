"""Stateful wrappers that turn the trainer's objects into checkpoint parts.

    app_state = {
        "model": ModelState(model_parts),                  # a list: one module per pp stage
        "optimizer": OptimizerState(model_parts, optimizers),
        "lr_scheduler": LRSchedulerState(schedulers),
        "dataloader": loader,        # the trainer's own Stateful parts
        "train_state": train_state,
    }

Model parts keep the whole model's FQNs (a pipeline stage drops the layers it does not own,
it does not rename the rest), so the merged state dict is the same for any pp/dp/tp split and
DCP reshards it: a checkpoint written at pp2 loads at dp2, and back. Optimizer state is
flattened by FQN for the same reason (`state.<fqn>.exp_avg`); each parameter's group
hyper-parameters are packed into one entry, `param_groups.<fqn>` = ((name, value), ...),
instead of one per hyper-parameter: DCP pickles every non-tensor entry separately, and
AdamW's eleven settings per parameter were most of the items in a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _as_list(x) -> list:
    return list(x) if isinstance(x, Sequence) else [x]


def _merge(parts: list[dict], what: str) -> dict:
    merged: dict = {}
    for sd in parts:
        clash = merged.keys() & sd.keys()
        assert not clash, f"{what} keys owned by two model parts: {sorted(clash)[:5]}"
        merged.update(sd)
    return merged


def _own(sd: dict, keys, what: str) -> dict:
    missing = [k for k in keys if k not in sd]
    if missing:
        raise ValueError(f"{what} state is missing {len(missing)} keys, e.g. {missing[:3]}")
    return {k: sd[k] for k in keys}


def _unwrapped(value):
    """A parameter whose shard is a wrapper subclass over one plain tensor (torchao's FP8
    weights under FSDP2 wrap their bf16/fp32 data to cast it before the all-gather) as a
    DTensor over that plain tensor, sharing its storage: wrappers own no storage, so DCP's
    stager would copy uninitialised bytes, and an in-place load would miss the data."""
    if not isinstance(value, DTensor):
        return value
    local = value._local_tensor
    if not is_traceable_wrapper_subclass(local):
        return value
    inner, _ = local.__tensor_flatten__()
    if len(inner) != 1:
        return value
    with torch.no_grad():
        return DTensor.from_local(getattr(local, inner[0]), value.device_mesh, value.placements,
                                  run_check=False, shape=value.shape, stride=value.stride())


def _model_state_dict(m: nn.Module) -> dict:
    return {k: _unwrapped(v) for k, v in get_model_state_dict(m).items()}


def _same_storage(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    a = a.to_local() if isinstance(a, DTensor) else a
    b = b.to_local() if isinstance(b, DTensor) else b
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


class ModelState(Stateful):
    """All model parts (pipeline stages / virtual stages) as one state dict with global FQNs."""

    def __init__(self, model_parts: nn.Module | Sequence[nn.Module]):
        self.model_parts = _as_list(model_parts)

    def state_dict(self) -> dict:
        return _merge([_model_state_dict(m) for m in self.model_parts], "model")

    def load_state_dict(self, state_dict: dict) -> None:
        for m in self.model_parts:
            own = _model_state_dict(m)
            theirs = _own(state_dict, own.keys(), "model")
            # dcp.load fills the tensors state_dict() returned, i.e. the parameters
            # themselves; copying each onto itself again would only cost a memcpy.
            if all(_same_storage(own[k], theirs[k]) for k in own):
                continue
            set_model_state_dict(m, theirs)


def pack_param_groups(flat: dict) -> dict:
    """`param_groups.<fqn>.<name>` entries -> one `param_groups.<fqn>` tuple per parameter."""
    out, groups = {}, {}
    for key, value in flat.items():
        if key.startswith("param_groups."):
            fqn, _, name = key[len("param_groups."):].rpartition(".")
            groups.setdefault(fqn, []).append((name, value))
        else:
            out[key] = value
    for fqn, items in groups.items():
        out[f"param_groups.{fqn}"] = tuple(sorted(items))
    return out


def unpack_param_groups(packed: dict) -> dict:
    out = {}
    for key, value in packed.items():
        if key.startswith("param_groups.") and isinstance(value, tuple):
            out.update({f"{key}.{name}": v for name, v in value})
        else:
            out[key] = value
    return out


# How a param group's step runs on this device, not training state: a checkpoint written by
# a fused (CUDA) optimizer must not turn a CPU run's foreach optimizer fused, nor the reverse.
_IMPLEMENTATION_FLAGS = ("fused", "foreach")


def _keep_implementation(loaded: dict, current: dict) -> dict:
    """`loaded` with the running optimizer's fused/foreach flags in every param group."""
    return {k: current[k] if k.startswith("param_groups.")
            and k.rpartition(".")[2] in _IMPLEMENTATION_FLAGS else v
            for k, v in loaded.items()}


class OptimizerState(Stateful):
    """One optimizer per model part (or one optimizer for a single part), flattened FQN keys."""

    def __init__(self, model_parts: nn.Module | Sequence[nn.Module], optimizers):
        self.model_parts = _as_list(model_parts)
        self.optimizers = _as_list(optimizers)
        if len(self.optimizers) != len(self.model_parts):
            raise ValueError(
                f"{len(self.optimizers)} optimizers for {len(self.model_parts)} model parts: "
                "give one optimizer per model part"
            )

    def _pairs(self):
        return zip(self.model_parts, self.optimizers, strict=True)

    def state_dict(self) -> dict:
        return pack_param_groups(_merge(
            [get_optimizer_state_dict(m, o, options=OPTIM_OPTIONS) for m, o in self._pairs()],
            "optimizer",
        ))

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = unpack_param_groups(state_dict)
        for m, o in self._pairs():
            own = get_optimizer_state_dict(m, o, options=OPTIM_OPTIONS)
            theirs = _keep_implementation(_own(state_dict, own.keys(), "optimizer"), own)
            set_optimizer_state_dict(m, o, optim_state_dict=theirs, options=OPTIM_OPTIONS)


class LRSchedulerState(Stateful):
    """The schedulers of all model parts step together, so one state stands for all."""

    def __init__(self, schedulers):
        self.schedulers = _as_list(schedulers)
        if not self.schedulers:
            raise ValueError("LRSchedulerState needs at least one scheduler")

    def state_dict(self) -> dict:
        sd = self.schedulers[0].state_dict()
        # LambdaLR keeps its lambdas' state as None for plain functions; nothing to save.
        return {k: v for k, v in sd.items() if k != "lr_lambdas"}

    def load_state_dict(self, state_dict: dict) -> None:
        for s in self.schedulers:
            s.load_state_dict({**s.state_dict(), **_per_group(state_dict, s)})


def _per_group(state_dict: dict, scheduler) -> dict:
    """The scheduler state with its per-group lists (`base_lrs`, `_last_lr`) fitted to this
    optimizer's groups: another layout groups parameters differently (one group per device
    mesh: expert parallelism adds one). Every group follows the same schedule, so a list of
    one value stretches; differing values cannot be mapped and are refused."""
    groups = len(scheduler.optimizer.param_groups)
    fitted = dict(state_dict)
    for key in ("base_lrs", "_last_lr"):
        values = state_dict.get(key)
        if not isinstance(values, list) or len(values) == groups:
            continue
        if len({float(v) for v in values}) != 1:
            raise ValueError(f"checkpoint lr scheduler {key} has {len(values)} different "
                             f"values, this optimizer {groups} parameter groups")
        fitted[key] = [values[0]] * groups
    return fitted
