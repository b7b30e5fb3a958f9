"""S3 (or any S3-compatible endpoint) through boto3.

Large files go up as parallel multipart uploads with a per-part SHA-256 the server
checks; the whole object's SHA-256 travels as metadata (`x-amz-meta-sha256`) and is
verified on download, since multipart ETags and composite checksums are not content hashes.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

from fm_pipeline.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoreError,
    check_key,
    sha256_file,
)

MULTIPART_THRESHOLD = 16 << 20
PART_SIZE = 16 << 20


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise StoreError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if len(bucket) < 3:
        raise StoreError(f"invalid S3 bucket name in {uri!r}")
    return bucket, prefix.strip("/")


class S3Store(ObjectStore):
    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_concurrency: int = 8,
        connect_timeout_s: float = 5.0,
        max_attempts: int = 3,
    ):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket, self.prefix = parse_s3_uri(uri)
        # None: the AWS SDK's own configuration (AWS_ENDPOINT_URL_S3, ~/.aws/config).
        self.endpoint_url = self.s3_endpoint = endpoint_url
        self._client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=region or os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            config=Config(
                connect_timeout=connect_timeout_s,
                read_timeout=60,
                retries={"max_attempts": max_attempts, "mode": "standard"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self._transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD,
            multipart_chunksize=PART_SIZE,
            max_concurrency=max_concurrency,
            use_threads=True,
        )

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _error(self, verb: str, key: str, exc: Exception) -> StoreError:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
        if code in ("404", "NoSuchKey", "NotFound"):
            return ObjectNotFound(f"no object {self.uri_of(key)}")
        if code in ("412", "PreconditionFailed", "ConditionalRequestConflict"):
            return PreconditionFailed(f"{self.uri_of(key)} changed under a conditional "
                                      f"{verb} ({code})")
        return StoreError(f"cannot {verb} {self.uri_of(key)}{where}: {exc}")

    def put_file(self, local: str | Path, key: str) -> ObjectInfo:
        digest = sha256_file(local)
        size = Path(local).stat().st_size
        try:
            self._client.upload_file(
                str(local), self.bucket, self._key(key),
                ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": digest}},
                Config=self._transfer,
            )
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:  # botocore raises many unrelated types
            raise self._error("upload", key, e) from e
        if head["ContentLength"] != size or head.get("Metadata", {}).get("sha256") != digest:
            raise StoreError(
                f"upload of {self.uri_of(key)} did not verify: size {head['ContentLength']} "
                f"vs {size}, sha256 {head.get('Metadata', {}).get('sha256')} vs {digest}"
            )
        return ObjectInfo(key=key, size=size)

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data,
                ChecksumAlgorithm="SHA256", Metadata={"sha256": digest},
            )
        except Exception as e:
            raise self._error("upload", key, e) from e
        return ObjectInfo(key=key, size=len(data))

    def _expected_sha(self, key: str) -> str | None:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            raise self._error("read", key, e) from e
        return head.get("Metadata", {}).get("sha256")

    def get_file(self, key: str, local: str | Path) -> Path:
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        expected = self._expected_sha(key)
        tmp = local.with_name(f".{local.name}.download")
        try:
            self._client.download_file(self.bucket, self._key(key), str(tmp), Config=self._transfer)
        except Exception as e:
            tmp.unlink(missing_ok=True)
            raise self._error("download", key, e) from e
        if expected and sha256_file(tmp) != expected:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"download of {self.uri_of(key)} failed its SHA-256 check")
        os.replace(tmp, local)
        return local

    def get_bytes(self, key: str) -> bytes:
        buf = io.BytesIO()
        try:
            self._client.download_fileobj(self.bucket, self._key(key), buf, Config=self._transfer)
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            raise self._error("download", key, e) from e
        data = buf.getvalue()
        expected = head.get("Metadata", {}).get("sha256")
        if expected and hashlib.sha256(data).hexdigest() != expected:
            raise StoreError(f"download of {self.uri_of(key)} failed its SHA-256 check")
        return data

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as e:
            err = self._error("read", key, e)
            if isinstance(err, ObjectNotFound):
                return False
            raise err from e

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        out: list[ObjectInfo] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(key=obj["Key"][strip:], size=obj["Size"]))
        except Exception as e:
            raise self._error("list", prefix or "/", e) from e
        return sorted(out, key=lambda i: i.key)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        try:
            got = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return got["Body"].read(), got["ETag"]
        except Exception as e:
            raise self._error("read", key, e) from e

    def put_if(self, data: bytes, key: str, *, etag: str | None) -> str:
        # S3 conditional writes: If-None-Match "*" creates, If-Match replaces (RFC 7232).
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            return self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                           **condition)["ETag"]
        except Exception as e:
            raise self._error("write", key, e) from e

    def delete_if(self, key: str, *, etag: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=etag)
        except Exception as e:
            raise self._error("delete", key, e) from e

    def copy(self, src: str, dest: str) -> ObjectInfo:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(src))
            # Managed copy (multipart past 5 GB); the SHA-256 metadata travels with it.
            self._client.copy({"Bucket": self.bucket, "Key": self._key(src)}, self.bucket,
                              self._key(dest), Config=self._transfer,
                              ExtraArgs={"Metadata": head.get("Metadata", {}),
                                         "MetadataDirective": "REPLACE"})
        except Exception as e:
            raise self._error("copy", src, e) from e
        return ObjectInfo(key=dest, size=head["ContentLength"])

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            raise self._error("delete", key, e) from e
