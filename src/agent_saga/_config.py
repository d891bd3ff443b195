"""The one module that reads environment variables.

Everything else receives configuration explicitly; these functions are only the
fallbacks used when a caller passed nothing.
"""

from __future__ import annotations

import base64
import binascii
import os

from .errors import SagaUsageError

__all__ = [
    "DEFAULT_WAL_PATH",
    "audit_key_text",
    "decode_key",
    "default_wal_path",
    "redis_password",
    "stripe_api_base",
    "ui_token",
    "wal_key",
]

DEFAULT_WAL_PATH = "./agent-saga.wal"


def default_wal_path() -> str:
    """Return ``AGENT_SAGA_WAL_PATH`` if set and non-empty, else ``./agent-saga.wal``."""
    return os.environ.get("AGENT_SAGA_WAL_PATH") or DEFAULT_WAL_PATH


def wal_key() -> bytes | None:
    """Return the 32-byte WAL key from ``AGENT_SAGA_WAL_KEY``, or None when unset.

    Accepts standard or URL-safe base64, with or without padding.

    Raises:
        SagaUsageError: the variable is set but is not base64 of exactly 32 bytes.
    """
    raw = os.environ.get("AGENT_SAGA_WAL_KEY", "").strip()
    if not raw:
        return None
    return decode_key(raw, source="AGENT_SAGA_WAL_KEY")


def decode_key(text: str, *, source: str = "key") -> bytes:
    """Decode a base64 (standard or URL-safe) 256-bit key; the error never echoes the key."""
    padded = text + "=" * (-len(text) % 4)
    try:
        key = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise SagaUsageError(
            f"{source} is not valid base64; generate one with "
            '`python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())"`'
        ) from None
    if len(key) != 32:
        raise SagaUsageError(f"{source} must decode to 32 bytes (256 bits), got {len(key)}")
    return key


def audit_key_text() -> str | None:
    """Return ``AGENT_SAGA_AUDIT_KEY`` if set and non-empty: the checkpoint signing key.

    The text is a key or a credential reference (``ref:NAME``); what it may be is
    :func:`agent_saga.wal.checkpoints.audit_key_from_text`'s to say.
    """
    return os.environ.get("AGENT_SAGA_AUDIT_KEY", "").strip() or None


def ui_token() -> str | None:
    """Return ``AGENT_SAGA_UI_TOKEN`` if set and non-empty."""
    return os.environ.get("AGENT_SAGA_UI_TOKEN") or None


def stripe_api_base() -> str | None:
    """Return ``STRIPE_API_BASE`` if set and non-empty (the Stripe connector's endpoint)."""
    return os.environ.get("STRIPE_API_BASE") or None


def redis_password() -> str | None:
    """Return ``REDISCLI_AUTH`` if set and non-empty: the Redis lock's password.

    The same variable ``redis-cli`` reads; it keeps the password out of URLs, shell
    history and ``ps``.
    """
    return os.environ.get("REDISCLI_AUTH") or None
