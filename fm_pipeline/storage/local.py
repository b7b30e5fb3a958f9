"""A directory as an object store; each write goes to a temp file, fsync, then rename."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from fm_pipeline.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoreError,
    check_key,
)
from fm_pipeline.storage.durable import atomic_write_with
from fm_pipeline.storage.walk import walk_files


def _is_sidecar(name: str) -> bool:
    """A write's temporary file or a conditional operation's lock: not an object."""
    return name.endswith(".tmp") or (name.startswith(".") and name.endswith(".lock"))


class LocalStore(ObjectStore):
    def __init__(self, root: str | Path, *, s3_endpoint: str | None = None):
        self.root = Path(root).expanduser().resolve()
        self.s3_endpoint = s3_endpoint

    @property
    def uri(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def _atomic_write(self, key: str, write) -> ObjectInfo:
        dest = self._path(key)
        try:
            atomic_write_with(dest, write)
        except OSError as e:
            raise StoreError(f"cannot write {self.uri_of(key)}: {e}") from e
        return ObjectInfo(key=key, size=dest.stat().st_size)

    def put_file(self, local: str | Path, key: str) -> ObjectInfo:
        with open(local, "rb") as src:
            return self._atomic_write(key, lambda f: shutil.copyfileobj(src, f, 8 << 20))

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        return self._atomic_write(key, lambda f: f.write(data))

    def get_file(self, key: str, local: str | Path) -> Path:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(f"no object {self.uri_of(key)}")
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        if local.resolve() != src.resolve():
            shutil.copyfile(src, local)
        return local

    def get_bytes(self, key: str) -> bytes:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(f"no object {self.uri_of(key)}")
        return src.read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        if not self.root.exists():
            return []
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.exists():
            return []
        out = [ObjectInfo(key=key, size=size)
               for key, size in walk_files(self.root, under=base, skip=_is_sidecar)
               if key.startswith(prefix)]
        return sorted(out, key=lambda i: i.key)

    @contextlib.contextmanager
    def _exclusive(self, key: str):
        """Conditional operations on one key serialise on an flock of a sidecar file (works
        across processes, and across hosts where the filesystem honours flock)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield path
        finally:
            os.close(fd)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        with self._exclusive(key) as path:
            if not path.is_file():
                raise ObjectNotFound(f"no object {self.uri_of(key)}")
            data = path.read_bytes()
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, data: bytes, key: str, *, etag: str | None) -> str:
        with self._exclusive(key) as path:
            current = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            if current != etag:
                raise PreconditionFailed(f"{self.uri_of(key)} changed under a conditional write")
            self.put_bytes(data, key)
        return hashlib.sha256(data).hexdigest()

    def delete_if(self, key: str, *, etag: str) -> None:
        with self._exclusive(key) as path:
            if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != etag:
                raise PreconditionFailed(f"{self.uri_of(key)} changed under a conditional "
                                         "delete")
            self.delete(key)

    def copy(self, src: str, dest: str) -> ObjectInfo:
        path = self._path(src)
        if not path.is_file():
            raise ObjectNotFound(f"no object {self.uri_of(src)}")
        return self.put_file(path, dest)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Drop directories the deletion left empty, up to the root.
        parent = path.parent
        while parent != self.root and parent.exists() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
