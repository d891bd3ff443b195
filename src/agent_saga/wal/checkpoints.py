"""Signed checkpoints of a log's tree: the keys, the record, the anchor file.

A checkpoint (``docs/log-format.md`` §12.7) signs the tree of the leaves before it:
its size, its root, the time and the log's id, in the fixed text form of
:func:`agent_saga.wal.verifier.checkpoint_text`. It is written into the log as a
``checkpoint`` record and, by ``agent-saga wal seal --out``, as an *anchor* file kept
elsewhere (:meth:`~agent_saga.wal.verifier.Checkpoint.file_form`).

Keys come from ``AGENT_SAGA_AUDIT_KEY`` (read by :mod:`agent_saga._config`) or are
passed in, as text:

* ``ed25519:<seed>`` or a bare seed — 32 bytes, hex or base64 — or a PEM Ed25519
  private key: Ed25519 signatures, through ``cryptography`` (the ``encryption``
  extra). Anyone with the public key can check them; only the key's holder can make
  them.
* ``hmac:<secret>`` (at least 16 bytes): HMAC-SHA256, standard library only. Weaker:
  whoever can check an HMAC checkpoint holds the secret and can make one, so it
  proves only that *someone holding the key* wrote it — not which party.
* ``ed25519-pub:<key>``: a public key — verifies, cannot seal.
* ``ref:NAME``: a credential reference; the installed credential resolver
  (:func:`agent_saga.connectors.set_credential_resolver`) returns one of the above.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _config
from .._credentials import resolve_credential
from ..errors import MissingExtra, SagaUsageError, WALAnchorInvalid, install_hint
from .records import CHECKPOINT
from .tree import LogTree
from .verifier import (
    Checkpoint,
    ProofError,
    VerifyKey,
    checkpoint_text,
    decode_bytes,
    ed25519_key_id,
    parse_checkpoint,
    parse_key,
)

__all__ = [
    "AuditKey",
    "checkpoint_of_record",
    "checkpoint_of_record_or_frontierless",
    "checkpoint_record",
    "read_anchor",
    "signing_key",
    "verifying_key",
    "write_anchor",
]

_ENV = "AGENT_SAGA_AUDIT_KEY"
_NO_LOG = "-"  # the log id of a log written before headers existed


@dataclass(frozen=True)
class AuditKey:
    """A key that signs checkpoints.

    Attributes:
        verify_key: Its verifying half (the public key, or the same HMAC secret).
        public_text: What to give an auditor to pin it (``ed25519-pub:<base64>``);
            None for an HMAC key, which must not be handed out.
    """

    verify_key: VerifyKey
    public_text: str | None
    _private: Any = field(repr=False, default=None)

    @property
    def alg(self) -> str:
        """``"ed25519"`` or ``"hmac-sha256"``."""
        return self.verify_key.alg

    @property
    def key_id(self) -> str:
        """8 hex digits naming the key."""
        return self.verify_key.key_id

    def sign(self, message: bytes) -> bytes:
        """The signature of ``message``."""
        if self._private is None:  # HMAC: the verifying key is the secret
            import hashlib
            import hmac

            return hmac.new(self.verify_key.material, message, hashlib.sha256).digest()
        sig: bytes = self._private.sign(message)
        return sig


def _crypto(source: str) -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise MissingExtra(
            f"{source} holds an Ed25519 key, which needs the 'encryption' extra: "
            f"{install_hint('encryption')}; or use an hmac:<secret> key, which is weaker "
            "(see docs/audit.md)",
            extra="encryption",
            package="cryptography",
        ) from None
    return ed25519, serialization


def _resolved(text: str, source: str) -> str:
    if text.startswith("ref:"):
        name = text[4:].strip()
        secret = resolve_credential(name)
        if secret.startswith("ref:"):
            raise SagaUsageError(f"{source}: the credential {name!r} is another reference")
        return secret.strip()
    return text


def _load(text: str, source: str) -> AuditKey | VerifyKey:
    text = _resolved(text.strip(), source)
    if text.startswith("-----BEGIN"):
        ed25519, serialization = _crypto(source)
        try:
            if "PUBLIC KEY" in text.split("\n", 1)[0]:
                key = serialization.load_pem_public_key(text.encode())
            else:
                key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError):
            raise SagaUsageError(f"{source} is not a readable PEM key") from None
        if isinstance(key, ed25519.Ed25519PublicKey):
            raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            return VerifyKey("ed25519", ed25519_key_id(raw), raw)
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise SagaUsageError(f"{source}: only Ed25519 PEM keys sign checkpoints")
        return _ed25519_key(key, serialization)
    prefix, sep, rest = text.partition(":")
    try:
        if sep and prefix in ("hmac", "ed25519-pub"):
            vk = parse_key(text, source)
            if vk.alg == "hmac-sha256":
                return AuditKey(vk, None)
            return vk
        seed = decode_bytes(rest if sep and prefix == "ed25519" else text, source)
    except ProofError as exc:
        raise SagaUsageError(str(exc)) from None
    if len(seed) != 32:
        raise SagaUsageError(f"{source}: an Ed25519 key is a 32-byte seed, got {len(seed)} bytes")
    ed25519, serialization = _crypto(source)
    return _ed25519_key(ed25519.Ed25519PrivateKey.from_private_bytes(seed), serialization)


def _ed25519_key(private: Any, serialization: Any) -> AuditKey:
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    vk = VerifyKey("ed25519", ed25519_key_id(raw), raw)
    return AuditKey(vk, "ed25519-pub:" + base64.b64encode(raw).decode(), private)


def signing_key(text: str | None = None) -> AuditKey:
    """The key checkpoints are signed with: ``text``, else ``AGENT_SAGA_AUDIT_KEY``.

    Args:
        text: A key in one of the forms of the module docstring.

    Returns:
        The key.

    Raises:
        SagaUsageError: no key, a public key only, or unreadable key text (the
            message never contains the key).
        MissingExtra: an Ed25519 key and ``cryptography`` is not installed.
    """
    source = "the audit key" if text is not None else _ENV
    if text is None:
        text = _config.audit_key_text()
    if text is None:
        raise SagaUsageError(
            f"set {_ENV} to the checkpoint signing key (ed25519:<32-byte seed>, or "
            "hmac:<secret>, or ref:NAME for your credential resolver); see docs/audit.md"
        )
    key = _load(text, source)
    if isinstance(key, VerifyKey):
        raise SagaUsageError(f"{source} is a public key: it verifies checkpoints, not signs them")
    return key


def verifying_key(text: str | None = None) -> VerifyKey | None:
    """The key checkpoints are checked with: ``text``, else ``AGENT_SAGA_AUDIT_KEY``.

    Args:
        text: A key in one of the forms of the module docstring.

    Returns:
        The verifying key, or None when no key is configured.

    Raises:
        SagaUsageError: unreadable key text.
        MissingExtra: an Ed25519 private key and ``cryptography`` is not installed.
    """
    source = "the audit key" if text is not None else _ENV
    if text is None:
        text = _config.audit_key_text()
    if text is None:
        return None
    key = _load(text, source)
    return key.verify_key if isinstance(key, AuditKey) else key


def checkpoint_record(tree: LogTree, key: AuditKey, *, by: str, now: float) -> dict[str, Any]:
    """The ``checkpoint`` record signing ``tree`` (to be its next leaf).

    Args:
        tree: The log's tree as it is just before the record.
        key: The signing key.
        by: Who writes it (the writer's owner id).
        now: The log's clock, in epoch seconds.

    Returns:
        The record: ``size``, ``root``, ``frontier``, ``ts``, ``sig``, ``by``.
    """
    ts_ms = int(now * 1000)
    root = tree.root()
    signature = key.sign(checkpoint_text(tree.log or _NO_LOG, tree.size, root, ts_ms))
    b64 = base64.b64encode
    sig = {"alg": key.alg, "key_id": key.key_id, "value": b64(signature).decode()}
    if key.alg == "ed25519":
        sig["key"] = b64(key.verify_key.material).decode()
    return {
        "type": CHECKPOINT,
        "size": tree.size,
        "root": b64(root).decode(),
        "frontier": [b64(n).decode() for n in tree.frontier.nodes],
        "ts": ts_ms / 1000,
        "sig": sig,
        "by": by,
        "min_reader": 3,
    }


def checkpoint_of_record(data: Mapping[str, Any], log: str | None) -> Checkpoint:
    """The checkpoint a ``checkpoint`` record states, for the log ``log``.

    Args:
        data: The record.
        log: The log's id (from its header).

    Returns:
        The checkpoint (its signature not yet checked).

    Raises:
        ProofError: the record is malformed.
    """
    try:
        sig = data["sig"]
        lines = [
            "agent-saga/checkpoint/v1",
            f"log {log or _NO_LOG}",
            f"size {int(data['size'])}",
            f"root {data['root']}",
            f"ts {round(float(data['ts']) * 1000)}",
            "",
            " ".join(
                ["sig", str(sig["alg"]), str(sig["key_id"]), str(sig["value"])]
                + ([str(sig["key"])] if sig.get("key") is not None else [])
            ),
        ]
        frontier = data.get("frontier")
        if frontier:
            lines.append("frontier " + " ".join(str(n) for n in frontier))
    except (KeyError, TypeError, ValueError):
        raise ProofError("a checkpoint record without a valid size, root, ts or sig") from None
    return parse_checkpoint("\n".join(lines) + "\n")


def checkpoint_of_record_or_frontierless(data: Mapping[str, Any], log: str | None) -> Checkpoint:
    """:func:`checkpoint_of_record`, ignoring an unusable ``frontier`` (it is not signed).

    An edited frontier costs a reader only the location of a departure, never the
    check itself; anything else malformed still raises.

    Raises:
        ProofError: the record is malformed beyond its frontier (the first error).
    """
    try:
        return checkpoint_of_record(data, log)
    except ProofError as exc:
        try:
            return checkpoint_of_record({**data, "frontier": None}, log)
        except ProofError:
            raise exc from None


def read_anchor(path: str | os.PathLike[str]) -> Checkpoint:
    """Read an anchor file (what ``wal seal --out`` wrote).

    Raises:
        WALAnchorInvalid: unreadable or not a well-formed checkpoint.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        raise WALAnchorInvalid(f"cannot read the anchor {os.fspath(path)}: {why}") from None
    try:
        return parse_checkpoint(text)
    except ProofError as exc:
        raise WALAnchorInvalid(f"the anchor {os.fspath(path)} is corrupt: {exc}") from None


def write_anchor(cp: Checkpoint, out: str | os.PathLike[str]) -> str:
    """Write ``cp``'s file form to ``out`` durably; return the file written.

    Args:
        cp: The checkpoint.
        out: A file, or an existing directory (the file is then named
            ``<log id>-<size>.checkpoint`` inside it, for a witness that syncs it).

    Returns:
        The path written.

    Raises:
        OSError: it cannot be written.
    """
    path = os.fspath(out)
    if os.path.isdir(path):
        path = os.path.join(path, f"{cp.log}-{cp.size:012d}.checkpoint")
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, cp.file_form().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path
