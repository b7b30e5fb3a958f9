"""What a checkpoint's DCP `.metadata` says, read without torch and without running its code.

    outline = read_outline(data)     # data: the bytes of <checkpoint>/.metadata
    outline.state_keys               # {"model.tok_embeddings.weight", "optimizer.state...", ...}
    outline.storage                  # [(relative_path, offset, length), ...]

torch writes `.metadata` as a pickle of its Metadata dataclass. Unpickling it with torch
imports torch (2 s on the control side, for every check of every checkpoint) and runs
whatever the file asks: a file from an object store is not trusted. Here only the names
DCP's metadata is built from may be looked up (anything else is an error naming it); each
becomes a plain record holding its fields, so nothing of torch is needed or executed. The
validator checks the outline against the manifest; a restore still reads the file with
torch itself.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import PurePosixPath

# Modules whose names a DCP metadata pickle may refer to. Which names within them are used
# changes between torch versions (storage_meta, _MEM_FORMAT_ENCODING came later), so the
# module, not the name, is the unit; no real object of these modules is ever created.
_TORCH_MODULES = ("torch", "torch.serialization", "torch.distributed.checkpoint.metadata",
                  "torch.distributed.checkpoint.filesystem",
                  "torch.distributed.checkpoint._extension")


def _path(*parts: str) -> str:  # pathlib pickles a path as its parts
    return str(PurePosixPath(*parts))


_PLAIN = {("pathlib", "PosixPath"): _path, ("pathlib", "PurePosixPath"): _path,
          ("collections", "OrderedDict"): dict, ("builtins", "set"): set,
          ("builtins", "frozenset"): frozenset}


class OutlineError(ValueError):
    """The bytes are not a DCP metadata pickle (truncated, corrupt, or other content)."""


class _Record:
    """Stands in for one torch class: takes any constructor arguments and any state."""

    _name = "?"

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        self.__dict__["_args"] = args
        return self

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)

    def __reduce__(self):  # never re-pickled; a record is not the real thing
        raise TypeError(f"{self._name} is an outline record, not torch's object")

    def __repr__(self) -> str:
        return f"<{self._name}>"


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self._classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        if (module, name) in _PLAIN:
            return _PLAIN[(module, name)]
        if module not in _TORCH_MODULES:
            raise OutlineError(f"refers to {module}.{name}, which DCP metadata never holds")
        key = (module, name)
        if key not in self._classes:
            self._classes[key] = type(name, (_Record,), {"_name": f"{module}.{name}"})
        return self._classes[key]


@dataclass(frozen=True)
class Outline:
    state_keys: frozenset[str]  # fully qualified state-dict keys ("model.layers.0.wq.weight")
    storage: tuple[tuple[str, int, int], ...]  # (relative_path, offset, length) per item


def read_outline(data: bytes) -> Outline:
    """The state keys and storage references of a `.metadata` (see the module docstring)."""
    try:
        meta = _Unpickler(data).load()
    except OutlineError:
        raise
    except Exception as e:  # pickle raises UnpicklingError, EOFError, ValueError, ... alike
        raise OutlineError(f"not a readable pickle: {type(e).__name__}: {e}") from None
    if getattr(meta, "_name", "") != "torch.distributed.checkpoint.metadata.Metadata":
        raise OutlineError(f"holds {type(meta).__name__}, not DCP's Metadata")
    keys = getattr(meta, "state_dict_metadata", None)
    storage = getattr(meta, "storage_data", None) or {}
    if not isinstance(keys, dict) or not isinstance(storage, dict):
        raise OutlineError("its Metadata has no state_dict_metadata / storage_data mapping")
    refs = []
    for info in storage.values():
        path = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if path is None:
            continue
        if not isinstance(offset, int) or not isinstance(length, int):
            raise OutlineError(f"a storage entry of {path} has no integer offset/length")
        refs.append((str(path), offset, length))
    return Outline(state_keys=frozenset(map(str, keys)), storage=tuple(refs))
