"""AES-256-GCM encryption of WAL records (extra ``encryption``).

Envelope (the payload of a kind-2 frame)::

    key id   4 bytes   sha256(key)[:4] — lets a reader say "wrong key" precisely
    nonce   12 bytes   random per record
    body     n + 16    ciphertext and GCM tag

The AAD binds every envelope to this log format version. ``cryptography`` is
imported only when an encryptor is built, so the core stays dependency-free.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any, Final

from .. import _config
from ..errors import SagaUsageError, WALAuthenticationFailed, install_hint
from .format import Encryptor

__all__ = ["AAD", "AesGcmEncryptor", "Encryptor", "encryptor_from_env", "key_id"]

AAD: Final = b"agent-saga/wal/v1"
_NONCE: Final = 12
_KEY_ID: Final = 4


def key_id(key: bytes) -> bytes:
    """Return the 4-byte id of ``key`` stored in every envelope.

    Args:
        key: The 32-byte key.

    Returns:
        The first 4 bytes of ``sha256(key)`` (reveals nothing usable about the key).
    """
    return hashlib.sha256(key).digest()[:_KEY_ID]


class AesGcmEncryptor:
    """Seal and open WAL records with AES-256-GCM.

    Args:
        key: 32 raw bytes.

    Raises:
        SagaUsageError: the key is not 32 bytes, or ``cryptography`` is missing.
    """

    __slots__ = ("_aead", "_key_id", "_name_key")

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise SagaUsageError(f"WAL key must be 32 bytes (256 bits), got {len(key)}")
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise SagaUsageError(
                f"WAL encryption needs the 'encryption' extra: {install_hint('encryption')}"
            ) from None
        self._aead: Any = AESGCM(key)
        self._key_id = key_id(key)
        self._name_key = hashlib.sha256(b"agent-saga/snapshot-names/v1" + key).digest()

    def keyed_name(self, digest: str) -> str:
        """Return the file name of an encrypted snapshot whose content hashes to ``digest``.

        A keyed hash, so that the names in the snapshot store do not let anyone
        with the disk but without the key confirm a guess of a file's content.

        Args:
            digest: The content's sha256 hex digest.

        Returns:
            64 hex digits.
        """
        return hmac.new(self._name_key, digest.encode("ascii"), hashlib.sha256).hexdigest()

    def encrypt(self, plaintext: bytes) -> bytes:
        """Seal one record.

        Args:
            plaintext: The record's JSON bytes.

        Returns:
            key id + nonce + ciphertext-with-tag.
        """
        nonce = os.urandom(_NONCE)
        body: bytes = self._aead.encrypt(nonce, plaintext, AAD)
        return self._key_id + nonce + body

    def decrypt(self, blob: bytes, *, offset: int) -> bytes:
        """Open one envelope.

        Args:
            blob: The frame payload.
            offset: Byte offset of the frame (reported in errors).

        Returns:
            The record's JSON bytes.

        Raises:
            WALAuthenticationFailed: the envelope was sealed with another key, or its
                bytes were altered.
        """
        if len(blob) < _KEY_ID + _NONCE + 16:
            raise WALAuthenticationFailed(
                f"encrypted WAL record at offset {offset} is too short to be authentic",
                offset=offset,
            )
        if blob[:_KEY_ID] != self._key_id:
            raise WALAuthenticationFailed(
                f"WAL record at offset {offset} was encrypted with a different key "
                f"(key id {bytes(blob[:_KEY_ID]).hex()}, ours {self._key_id.hex()}); "
                "set AGENT_SAGA_WAL_KEY to the key the log was written with",
                offset=offset,
            )
        from cryptography.exceptions import InvalidTag

        try:
            out: bytes = self._aead.decrypt(
                bytes(blob[_KEY_ID : _KEY_ID + _NONCE]), bytes(blob[_KEY_ID + _NONCE :]), AAD
            )
        except InvalidTag:
            raise WALAuthenticationFailed(
                f"WAL record at offset {offset} failed authentication: "
                "its bytes were altered after it was written",
                offset=offset,
            ) from None
        return out


def encryptor_from_env() -> AesGcmEncryptor | None:
    """Build an encryptor from ``AGENT_SAGA_WAL_KEY``, if it is set.

    Returns:
        An :class:`AesGcmEncryptor`, or None when no key is configured.

    Raises:
        SagaUsageError: the key is malformed or ``cryptography`` is missing.
    """
    key = _config.wal_key()
    return None if key is None else AesGcmEncryptor(key)
