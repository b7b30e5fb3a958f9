"""Read one DCP tensor record (a `torch.save` zip of a single tensor) from bytes in memory.

DCP's FileSystemWriter stores each tensor as its own `torch.save` zip inside a `.distcp`
file. torch's reader `torch.load`s every record into freshly allocated memory and copies it
into the destination: two copies and a page fault per fresh page. `tensor_view(buf)` instead
parses the zip's central directory and the record's pickle (only `_rebuild_tensor_v2` of one
storage is accepted) and returns a tensor viewing `buf` with the saved dtype, shape, strides
and storage offset, so the caller copies once, straight into the live tensor.

Anything it does not recognise (zip64, compression, other pickled objects) returns None and
the caller falls back to `torch.load`, so this is an optimisation, never a format of its own.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from dataclasses import dataclass

import torch

_EOCD = struct.Struct("<IHHHHIIH")  # end of central directory, without the comment
_CDIR = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory file header
_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header
_EOCD_SIG, _CDIR_SIG, _LOCAL_SIG = 0x06054B50, 0x02014B50, 0x04034B50
_EOCD_MAGIC = struct.pack("<I", _EOCD_SIG)


def _storage_dtypes() -> dict[str, torch.dtype]:
    """torch.save pickles a storage's dtype as its legacy class (torch.FloatStorage...)."""
    import warnings

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # touching the legacy classes warns
        for name in dir(torch):
            cls = getattr(torch, name)
            if name.endswith("Storage") and isinstance(getattr(cls, "dtype", None), torch.dtype):
                out[name] = cls.dtype
    return out


_STORAGE_DTYPES = _storage_dtypes()


@dataclass(frozen=True)
class _Storage:
    dtype: torch.dtype
    key: str
    numel: int


@dataclass(frozen=True)
class _Rebuilt:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=(), metadata=None):
    if not isinstance(storage, _Storage) or backward_hooks:
        raise pickle.UnpicklingError("not a plain tensor record")
    return _Rebuilt(storage, int(storage_offset), tuple(size), tuple(stride))


class _TensorUnpickler(pickle.Unpickler):
    """Accepts exactly what torch.save writes for one tensor; anything else raises."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a tensor record")

    def persistent_load(self, pid):
        kind, storage_type, key, _location, numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unexpected persistent id {kind!r}")
        if not isinstance(storage_type, torch.dtype):
            raise pickle.UnpicklingError(f"unexpected storage type {storage_type!r}")
        return _Storage(dtype=storage_type, key=str(key), numel=int(numel))


class _Window:
    """Bytes [start, start + len(data)) of a record of `length` bytes."""

    def __init__(self, data, start: int):
        self.data, self.start = data, start

    def get(self, offset: int, n: int) -> bytes:
        lo = offset - self.start
        if lo < 0 or lo + n > len(self.data):
            raise IndexError(f"bytes {offset}..{offset + n} are outside the window read")
        return bytes(self.data[lo:lo + n])


def _directory(tail: _Window, length: int) -> dict[str, tuple[int, int]] | None:
    """name -> (local header offset, size) from the central directory in `tail`."""
    end = tail.get(length - _EOCD.size, _EOCD.size)
    if end[:4] != _EOCD_MAGIC:
        return None  # a zip comment or zip64: leave it to torch.load
    (_, _, _, _, count, cd_size, cd_offset, _) = _EOCD.unpack(end)
    if cd_offset == 0xFFFFFFFF or cd_offset + cd_size > length - _EOCD.size:
        return None
    out, pos = {}, cd_offset
    for _ in range(count):
        h = _CDIR.unpack(tail.get(pos, _CDIR.size))
        if h[0] != _CDIR_SIG:
            return None
        method, csize, usize, nlen, xlen, clen, local_at = h[4], h[8], h[9], h[10], h[11], \
            h[12], h[16]
        name = tail.get(pos + _CDIR.size, nlen).decode("utf-8", "replace")
        pos += _CDIR.size + nlen + xlen + clen
        if method != 0 or csize != usize or 0xFFFFFFFF in (csize, local_at):
            return None
        out[name] = (local_at, csize)
    return out


def _data_start(head: _Window, local_at: int) -> int:
    lh = _LOCAL.unpack(head.get(local_at, _LOCAL.size))
    if lh[0] != _LOCAL_SIG:
        raise ValueError("not a zip local header")
    return local_at + _LOCAL.size + lh[9] + lh[10]


@dataclass(frozen=True)
class TensorRecord:
    """Where a record's tensor lies, relative to the record's first byte."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    numel: int  # of the storage
    data_start: int
    data_size: int

    @property
    def is_dense(self) -> bool:
        """The storage is exactly the tensor, in row-major order."""
        expected, n = [], 1
        for dim in reversed(self.size):
            expected.append(n)
            n *= dim
        return (self.storage_offset == 0 and n == self.numel
                and (n <= 1 or tuple(reversed(expected)) == self.stride))


def _locate(head: _Window, tail: _Window, length: int) -> TensorRecord | None:
    directory = _directory(tail, length)
    if not directory:
        return None
    pkl = [n for n in directory if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        return None
    prefix = pkl[0][: -len("data.pkl")]
    local_at, size = directory[pkl[0]]
    start = _data_start(head, local_at)
    obj = _TensorUnpickler(io.BytesIO(head.get(start, size))).load()
    if not isinstance(obj, _Rebuilt):
        return None
    st = obj.storage
    local_at, size = directory.get(f"{prefix}data/{st.key}", (None, None))
    itemsize = torch.empty((), dtype=st.dtype).element_size()
    if local_at is None or size != st.numel * itemsize:
        return None
    start = _data_start(head, local_at)
    span = 1 + sum((n - 1) * s for n, s in zip(obj.size, obj.stride, strict=True)) \
        if all(obj.size) else 0
    if obj.offset < 0 or obj.offset + span > st.numel or start + size > length:
        return None
    return TensorRecord(dtype=st.dtype, size=obj.size, stride=obj.stride,
                        storage_offset=obj.offset, numel=st.numel, data_start=start,
                        data_size=size)


_ERRORS = (pickle.UnpicklingError, struct.error, ValueError, TypeError, EOFError,
           AttributeError, IndexError, RuntimeError, KeyError)


def locate(head, tail, length: int) -> TensorRecord | None:
    """The layout of a tensor record of `length` bytes from its first bytes (`head`, which
    must reach the tensor's data) and its last ones (`tail`, holding the zip's central
    directory), or None when this parser does not recognise it."""
    try:
        return _locate(_Window(head, 0), _Window(tail, length - len(tail)), length)
    except _ERRORS:
        return None


def tensor_view(buf: memoryview) -> torch.Tensor | None:
    """The tensor `torch.save` wrote into `buf`, as a view of `buf` (no copy), or None when
    the record is not a plain single-tensor record this parser understands."""
    rec = locate(buf, buf, len(buf))
    if rec is None:
        return None
    try:
        flat = (torch.frombuffer(buf, dtype=rec.dtype, count=rec.numel, offset=rec.data_start)
                if rec.numel else torch.empty(0, dtype=rec.dtype))
        return flat.as_strided(rec.size, rec.stride, rec.storage_offset)
    except _ERRORS:
        return None
