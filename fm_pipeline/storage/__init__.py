"""Object stores: a local directory (default) or S3 via boto3, chosen by URI."""

from __future__ import annotations

from pathlib import Path

from fm_pipeline.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoreError,
    sha256_file,
)


def open_store(uri: str | Path, *, endpoint_url: str | None = None) -> ObjectStore:
    """`s3://bucket/prefix` -> S3Store; a path or `file://` URI -> LocalStore."""
    uri = str(uri)
    if uri.startswith("s3://"):
        from fm_pipeline.storage.s3 import S3Store

        return S3Store(uri, endpoint_url=endpoint_url)
    from fm_pipeline.storage.local import LocalStore

    return LocalStore(uri.removeprefix("file://"), s3_endpoint=endpoint_url)


__all__ = [
    "ObjectInfo", "ObjectNotFound", "ObjectStore", "PreconditionFailed", "StoreError",
    "open_store", "sha256_file",
]
