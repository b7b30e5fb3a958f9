"""API tokens: one or more per tenant, plus admin tokens; only their SHA-256 is stored.

    fm api token issue --tenant research     # prints the token once; stores its hash
    fm api token issue --admin
    curl -H "Authorization: Bearer $TOKEN" ...

Tokens are 256 random bits (`fmt_` + urlsafe base64), so a plain SHA-256 is enough to
store them (no dictionary to attack, unlike passwords). Verification compares the
presented token's hash with every stored hash using `hmac.compare_digest` and never stops
early, so timing reveals neither a match's position nor a prefix. The store is
`<FM_HOME>/api/tokens.json`, written atomically with mode 0600.
"""

from __future__ import annotations

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

from fm_pipeline.config.paths import fm_home

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


def tokens_path() -> Path:
    return fm_home() / "api" / "tokens.json"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


class TokenStore:
    """Hashed tokens on disk; `verify` is safe to call from many threads."""

    def __init__(self, path: Path | None = None):
        self.path = path or tokens_path()
        self._lock = threading.Lock()
        self._entries: list[dict] = []
        self._mtime: float | None = None

    def _load(self) -> list[dict]:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._entries, self._mtime = [], None
            return self._entries
        if mtime != self._mtime:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._entries, self._mtime = list(data.get("tokens", [])), mtime
        return self._entries

    def _save(self, entries: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"tokens": entries}, f, indent=1)
        os.replace(tmp, self.path)
        self._mtime = None

    def issue(self, *, tenant: str | None) -> tuple[str, str]:
        """A new token for `tenant` (None: admin). Returns (token_id, token); shown once."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = "tok-" + secrets.token_hex(4)
        with self._lock:
            entries = list(self._load())
            entries.append({"id": token_id, "tenant": tenant, "sha256": _digest(token),
                            "created_at": time.time()})
            self._save(entries)
        return token_id, token

    def revoke(self, token_id: str) -> bool:
        with self._lock:
            entries = list(self._load())
            kept = [e for e in entries if e["id"] != token_id]
            if len(kept) == len(entries):
                return False
            self._save(kept)
            return True

    def entries(self) -> list[dict]:
        """Token ids, tenants and creation times (never the hashes)."""
        with self._lock:
            return [{k: e[k] for k in ("id", "tenant", "created_at")} for e in self._load()]

    def verify(self, token: str) -> Principal | None:
        presented = _digest(token)
        match = None
        with self._lock:
            for entry in self._load():
                if hmac.compare_digest(presented, entry["sha256"]) and match is None:
                    match = entry
        if match is None:
            return None
        return Principal(token_id=match["id"], tenant=match["tenant"])


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
