"""Nested documents (the job spec, the plan) as MLflow params: dotted keys, string values
within MLflow's limits, and nothing secret.

    from fm_pipeline.tracking.params import flatten_params
    flat = flatten_params({"job": dump_job(job), "plan": plan})
    flat.params    # {"job.training.lr": "0.003", "plan.estimate.mfu": "0.41", ...}
    flat.redacted  # ["job.cluster.api_token", ...]  names only, never values

Rules: dicts recurse (key "a.b.c"); lists and tuples become compact JSON; None is "None"
(MLflow params are strings). A value longer than MLflow's 6000 characters is cut and ends in
a marker saying how long it was; log the whole document as an artifact when that matters.
A key whose name says it holds a credential (secret, password, credential, a `*_token`
but not `*_per_token`, a `*_key` such as access_key / api_key / private_key, or plain
`key`) is dropped, and so is any key below it; URLs have their user:password part masked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH

# Words (a key split at "_", "-" and camelCase) that mark a credential anywhere in a key.
_SECRET_WORDS = frozenset({
    "secret", "secrets", "password", "passwd", "pwd", "passphrase", "credential",
    "credentials", "apikey", "authorization", "cookie", "bearer", "privatekey",
})
# "<qualifier>_key" is a credential ("access_key", "api_key"); "mix_key" (a content hash) is not.
_KEY_QUALIFIERS = frozenset({"access", "api", "private", "secret", "signing", "encryption",
                             "client", "auth", "session", "master", "ssh"})
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@:\s]*):[^/@\s]*@")


@dataclass
class FlatParams:
    params: dict[str, str] = field(default_factory=dict)
    redacted: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)


def is_secret_key(name: str) -> bool:
    """True when one key component names a credential (see the module docstring)."""
    words = [w.lower() for w in re.split(r"[_\-\s]+|(?<=[a-z0-9])(?=[A-Z])", name) if w]
    if not words:
        return False
    if words == ["key"] or any(w in _SECRET_WORDS for w in words):
        return True
    # "api_token", "hf_token", "token"; not "flops_per_token" nor "token_shards".
    if words[-1] == "token" and (len(words) == 1 or words[-2] != "per"):
        return True
    joined = "".join(words)
    if any(s in joined for s in ("apikey", "privatekey", "accesskey", "secretkey")):
        return True
    return words[-1] == "key" and len(words) > 1 and words[-2] in _KEY_QUALIFIERS


def mask_url_credentials(text: str) -> str:
    """"https://bob:hunter2@host/x" -> "https://bob:***@host/x"."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def param_value(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str) if isinstance(
        value, (list, tuple)) else str(value)
    return mask_url_credentials(text)


def flatten_params(document: Mapping[str, Any], *, prefix: str = "") -> FlatParams:
    """Flatten `document` into MLflow params (see the module docstring for the rules)."""
    out = FlatParams()
    _flatten(out, prefix, document)
    return out


def _flatten(out: FlatParams, prefix: str, value: Any) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if is_secret_key(str(k)):
                out.redacted.append(key)
            else:
                _flatten(out, key, v)
        return
    if len(prefix) > MAX_KEY:
        raise ValueError(f"param key longer than MLflow's {MAX_KEY} characters: {prefix[:80]}...")
    text = param_value(value)
    if len(text) > MAX_PARAM_VALUE:
        marker = f"...[truncated, {len(text)} chars]"
        text = text[:MAX_PARAM_VALUE - len(marker)] + marker
        out.truncated.append(prefix)
    out.params[prefix] = text
