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
import zipfile
from dataclasses import dataclass, field
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
    # Non-tensor entries (step, topology, data cursor): key -> (relative_path, offset, length)
    plain_items: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def saving_ranks(self) -> set[int]:
        """Ranks whose `__{rank}_{n}.distcp` files hold data."""
        ranks = set()
        for path, _, _ in self.storage:
            head = PurePosixPath(path).name.split("_")
            if len(head) >= 4 and head[2].isdigit() and path.endswith(".distcp"):
                ranks.add(int(head[2]))
        return ranks


def read_plain_item(blob: bytes) -> object:
    """The value of a non-tensor DCP entry (torch.save's zip of a plain pickle: an int, a
    string, a dict of them), read without torch and without running any code: a pickle
    that names a class or function is refused."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            info = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
        return _PlainOnly(io.BytesIO(_stored_member(blob, info))).load()
    except OutlineError:
        raise
    except (StopIteration, zipfile.BadZipFile, pickle.UnpicklingError, EOFError,
            ValueError) as e:
        raise OutlineError(f"not a plain DCP entry: {type(e).__name__}: {e}") from None


def _stored_member(blob: bytes, info: zipfile.ZipInfo) -> bytes:
    """A STORED member's bytes, sliced after its local header. torch writes no CRC-32 for
    DCP entries, so zipfile's own read (which checks one) refuses them."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{info.filename} is compressed; torch.save stores entries")
    header = blob[info.header_offset:info.header_offset + 30]
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise ValueError("no local file header where the central directory points")
    start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(
        header[28:30], "little")
    return blob[start:start + info.file_size]


class _PlainOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise OutlineError(f"a plain entry refers to {module}.{name}")


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
    refs, plain = [], {}
    for index, info in storage.items():
        path = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if path is None:
            continue
        if not isinstance(offset, int) or not isinstance(length, int):
            raise OutlineError(f"a storage entry of {path} has no integer offset/length")
        refs.append((str(path), offset, length))
        fqn = getattr(index, "fqn", None)
        if isinstance(fqn, str) and getattr(keys.get(fqn), "_name", "").endswith(
                ".BytesStorageMetadata"):
            plain[fqn] = (str(path), offset, length)
    return Outline(state_keys=frozenset(map(str, keys)), storage=tuple(refs), plain_items=plain)
