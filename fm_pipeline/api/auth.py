"""API tokens: one or more per tenant, plus admin tokens; only their SHA-256 is stored.

    fm api token issue --tenant research     # prints the token once; stores its hash
    fm api token issue --admin
    curl -H "Authorization: Bearer $TOKEN" ...

Tokens are 256 random bits (`fmt_` + urlsafe base64), so a plain SHA-256 is enough to
store them (no dictionary to attack, unlike passwords). Verification compares the
presented token's hash with every stored hash using `hmac.compare_digest` and never stops
early, so timing reveals neither a match's position nor a prefix. The store is
`<site home>/api/tokens.json` (tokens_path), mode 0600, changed under a file lock by any
number of processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.config.site import Site
from fm_pipeline.storage.durable import atomic_write

TOKEN_PREFIX = "fmt_"
TOKEN_RE = re.compile(r"fmt_[A-Za-z0-9_\-]{16,}")
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s'\",]+")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant, or an admin (tenant None) who may act on every job."""

    token_id: str
    tenant: str | None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None


def tokens_path(site: Site) -> Path:
    return site.api_dir / "tokens.json"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


class TokenStoreUnreadable(RuntimeError):
    """tokens.json exists but cannot be parsed: no request is authorised until it is fixed."""


class TokenStore:
    """Hashed tokens on disk, safe with several processes (the CLI, one or more servers).

    Every change happens under an exclusive flock of `tokens.json.lock`: read, modify, write a
    unique temporary file, fsync, rename. A change is durable when the call returns, and no
    interleaving of writers loses one (each re-reads under the lock). `verify` re-reads the
    file whenever it changed (a stat per call), so a revocation counts at once everywhere.
    """

    def __init__(self, path: Path):
        self.path = Path(path)  # tokens_path(site)
        self._lock = threading.Lock()
        self._entries: list[dict] = []
        self._signature: tuple | None = None

    @contextlib.contextmanager
    def _flock(self, mode: int):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT,
                     0o600)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def _load(self) -> list[dict]:
        """The entries as the file holds them now (cached while its stat is unchanged)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._entries, self._signature = [], None
            return self._entries
        signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if signature != self._signature:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                entries = data["tokens"]
                if not isinstance(entries, list) or not all(
                        isinstance(e, dict) and {"id", "sha256"} <= e.keys() for e in entries):
                    raise ValueError("'tokens' must be a list of {id, tenant, sha256} objects")
            except (ValueError, KeyError, TypeError) as e:
                raise TokenStoreUnreadable(f"{self.path} cannot be read ({e}); fix or remove "
                                           "it and issue tokens again") from None
            self._entries, self._signature = list(entries), signature
        return self._entries

    def _save(self, entries: list[dict]) -> None:
        data = json.dumps({"tokens": entries}, indent=1).encode("utf-8")
        atomic_write(self.path, data, mode=0o600)
        self._signature = None

    def _change(self, edit) -> object:
        with self._lock, self._flock(fcntl.LOCK_EX):
            self._signature = None  # re-read under the lock: another process may have written
            entries = list(self._load())
            result, entries = edit(entries)
            if entries is not None:
                self._save(entries)
            return result

    def issue(self, *, tenant: str | None) -> tuple[str, str]:
        """A new token for `tenant` (None: admin). Returns (token_id, token); shown once."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = "tok-" + secrets.token_hex(4)
        entry = {"id": token_id, "tenant": tenant, "sha256": _digest(token),
                 "created_at": time.time()}
        self._change(lambda entries: (None, [*entries, entry]))
        return token_id, token

    def revoke(self, token_id: str) -> bool:
        """Remove a token; True when it existed. Refused everywhere once this returns."""
        def edit(entries):
            kept = [e for e in entries if e["id"] != token_id]
            return (len(kept) != len(entries)), (kept if len(kept) != len(entries) else None)

        return self._change(edit)

    def entries(self) -> list[dict]:
        """Token ids, tenants and creation times (never the hashes)."""
        with self._lock, self._flock(fcntl.LOCK_SH):
            return [{k: e.get(k) for k in ("id", "tenant", "created_at")} for e in self._load()]

    def verify(self, token: str) -> Principal | None:
        presented = _digest(token)
        match = None
        with self._lock, self._flock(fcntl.LOCK_SH):
            for entry in self._load():
                if hmac.compare_digest(presented, str(entry["sha256"])) and match is None:
                    match = entry
        if match is None:
            return None
        return Principal(token_id=match["id"], tenant=match.get("tenant"))


def redact(text: str) -> str:
    """Mask anything that looks like one of our tokens or a bearer credential."""
    return _BEARER_RE.sub(r"\1[redacted]", TOKEN_RE.sub("[redacted]", text))


class RedactSecrets(logging.Filter):
    """A logging filter that masks tokens in every record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):  # formatters (uvicorn's access log) unpack these
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True
