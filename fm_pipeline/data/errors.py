"""Errors a user can cause in the data pipeline; each message names the source, file or shard."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input or a mix that cannot be used: missing/empty sources, unknown formats, a
    mix that was never published."""


class CorruptShardError(DataError):
    """A shard, the sample index or the tokenizer does not match the SHA-256 or size its
    manifest records. Retrying cannot fix it: the mix must be prepared again."""

    def __init__(self, key: str, detail: str, *, what: str = "shard"):
        self.key = key
        super().__init__(f"corrupted {what} {key}: {detail}")
