"""The object-store contract: keys are '/'-separated paths under the store's root.

Writes are atomic per object: a reader sees the whole object or nothing. Multi-object
commits (a data mix, a checkpoint) are made atomic by writing their manifest last.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


class StoreError(RuntimeError):
    """The store could not be reached or refused an operation; the message names the key."""


class ObjectNotFound(StoreError):
    pass


class PreconditionFailed(StoreError):
    """A conditional write or delete lost its race: the object is not what the caller saw."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


def sha256_file(path: str | Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ObjectStore(ABC):
    """Local directory or S3 bucket/prefix; same verbs, same atomicity."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """Root URI of the store (a path or s3://bucket/prefix)."""

    def uri_of(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    # The S3 endpoint this store was opened with (config.site.Site.s3_endpoint): another
    # location read for it (a data source) is opened on the same S3 service.
    s3_endpoint: str | None = None

    @abstractmethod
    def put_file(self, local: str | Path, key: str) -> ObjectInfo: ...

    @abstractmethod
    def get_file(self, key: str, local: str | Path) -> Path: ...

    @abstractmethod
    def put_bytes(self, data: bytes, key: str) -> ObjectInfo: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    # Conditional writes: the building block of leases (one writer per object, decided by
    # the store). `etag` is opaque; only compare it with what these methods returned.
    @abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object and its current etag; ObjectNotFound when absent."""

    @abstractmethod
    def put_if(self, data: bytes, key: str, *, etag: str | None) -> str:
        """Write only if the object is absent (`etag` None) or still has `etag`; returns the
        new etag. PreconditionFailed when another writer got there first."""

    @abstractmethod
    def delete_if(self, key: str, *, etag: str) -> None:
        """Delete only if the object still has `etag`; PreconditionFailed otherwise."""

    def copy(self, src: str, dest: str) -> ObjectInfo:
        """Copy one object inside the store (S3: server-side)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="fm-store-copy-") as tmp:
            return self.put_file(self.get_file(src, Path(tmp) / "object"), dest)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns the bytes freed."""
        freed = 0
        for info in self.list(prefix):
            self.delete(info.key)
            freed += info.size
        return freed

    def local_path(self, key: str) -> Path | None:
        """A path that can be read in place, for stores on the local filesystem."""
        return None


def check_key(key: str) -> str:
    if not key or key.startswith("/") or ".." in key.split("/"):
        raise StoreError(f"invalid object key {key!r}: must be a relative path without '..'")
    return key
