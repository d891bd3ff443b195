"""Arguments a tool needs in clear but nothing may record: their keyed digests.

``@tool(secret_args=("new_password",))``: the function receives the value; every
record, refusal, approval request and trace holds ``{"$secret_arg": "hmac-sha256:…",
"key_id": …}`` in its place (``docs/log-format.md`` §12.4, ``docs/governance.md``).

The digest is ``HMAC-SHA256(k, canonical JSON of the value)`` with
``k = SHA-256("agent-saga/secret-arg/v1" ‖ key)``, the key being
``AGENT_SAGA_AUDIT_KEY`` or else ``AGENT_SAGA_WAL_KEY`` (as text). Without either, a
random key of this process (``key_id: "ephemeral"``): nothing about the value can be
confirmed later, not even that two calls had the same one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MARK", "digest_secret_args", "is_secret_digest"]

MARK: Final = "$secret_arg"
_KEY: list[tuple[bytes, str]] = []


def _key() -> tuple[bytes, str]:
    if not _KEY:
        raw = os.environ.get("AGENT_SAGA_AUDIT_KEY") or os.environ.get("AGENT_SAGA_WAL_KEY")
        if raw:
            k = hashlib.sha256(b"agent-saga/secret-arg/v1" + raw.encode()).digest()
            _KEY.append((k, hashlib.sha256(k).hexdigest()[:8]))
        else:
            _KEY.append((secrets.token_bytes(32), "ephemeral"))
    return _KEY[0]


def _digest(value: object) -> dict[str, str]:
    k, key_id = _key()
    canonical = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr
    ).encode()
    mac = hmac.new(k, canonical, hashlib.sha256).hexdigest()
    return {MARK: f"hmac-sha256:{mac}", "key_id": key_id}


def digest_secret_args(bound: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """``bound`` with each argument in ``names`` replaced by its keyed digest (a copy)."""
    return {k: (_digest(v) if k in names else v) for k, v in bound.items()}


def is_secret_digest(value: object) -> bool:
    """Whether ``value`` is what a secret argument is recorded as."""
    return isinstance(value, Mapping) and MARK in value
