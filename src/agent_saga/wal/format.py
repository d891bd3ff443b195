"""Frame encoding and decoding for the write-ahead log (pure: no I/O).

``docs/log-format.md`` is the normative description; this is its executable half.

A frame is a 12-byte little-endian header followed by the payload::

    magic   2 bytes   A5 5A      (both bytes > 0x7F: never inside ASCII JSON)
    version 1 byte    1
    kind    1 byte    1 = plaintext JSON record, 2 = encrypted JSON record
    length  u32       payload length, at most MAX_PAYLOAD
    crc32   u32       zlib.crc32(version | kind | length | payload)

Validity rule: a frame counts only if the magic, version, kind, length bound and
crc are all valid. Anything else is damage that readers skip and report.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Mapping
from json.encoder import (  # type: ignore[attr-defined]
    c_make_encoder,
    encode_basestring_ascii,
)
from typing import Any, Final, Literal, Protocol

from ..errors import SagaUsageError

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "KIND_ENCRYPTED",
    "KIND_PLAIN",
    "MAGIC",
    "MAX_PAYLOAD",
    "VERSION",
    "Encryptor",
    "HeaderCheck",
    "check_header",
    "decode_payload",
    "encode_frame",
    "encode_json",
    "encode_record",
    "frame_crc_ok",
    "header_prefix_plausible",
]

MAGIC: Final = b"\xa5\x5a"
VERSION: Final = 1
KIND_PLAIN: Final = 1
KIND_ENCRYPTED: Final = 2
HEADER_SIZE: Final = 12
MAX_PAYLOAD: Final = 16 * 1024 * 1024

#: The whole header: magic, version, kind, length, crc.
HEADER: Final = struct.Struct("<2sBBII")
# The crc covers version, kind and length too, so a flipped header bit is caught.
_CRC_PART: Final = struct.Struct("<BBI")


def _unserialisable(o: object) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _build_json_encoder() -> Callable[[Any], str]:
    # One pre-built encoder: ``json.dumps`` with non-default arguments builds a new
    # encoder on every call. ASCII-only output (ensure_ascii) is what guarantees the
    # magic never appears in a plaintext payload. The C encoder is driven directly,
    # without circular-reference markers (a cycle ends in RecursionError instead),
    # because encoding sits on every append's hot path.
    if c_make_encoder is not None:
        enc = c_make_encoder(
            None, _unserialisable, encode_basestring_ascii, None, ":", ",", False, False, True
        )

        def encode(o: Any) -> str:
            return "".join(enc(o, 0))

        return encode
    return json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode  # pragma: no cover


_json_encode = _build_json_encoder()


class Encryptor(Protocol):
    """What the log needs from an encryptor: seal and open one record's bytes.

    Implement this to plug in your own key management (e.g. a KMS-backed key).
    """

    def encrypt(self, plaintext: bytes) -> bytes:
        """Return the sealed envelope of ``plaintext``.

        Args:
            plaintext: The compact JSON of one record.

        Returns:
            The bytes stored as the payload of a kind-2 frame.
        """
        ...

    def decrypt(self, blob: bytes, *, offset: int) -> bytes:
        """Open an envelope produced by :meth:`encrypt`.

        Args:
            blob: The payload of a kind-2 frame.
            offset: The frame's byte offset, for the error.

        Returns:
            The plaintext JSON bytes.

        Raises:
            WALAuthenticationFailed: wrong key or altered bytes.
        """
        ...


def encode_json(record: Mapping[str, Any]) -> bytes:
    """Encode a record as compact, ASCII-only JSON.

    Args:
        record: A JSON-serialisable mapping with a string ``type``.

    Returns:
        The UTF-8 (in fact ASCII) bytes of the JSON object.

    Raises:
        SagaUsageError: the record is not JSON-serialisable.
    """
    try:
        return _json_encode(record).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise SagaUsageError(f"WAL record is not JSON-serialisable: {exc}") from None


def encode_frame(payload: bytes, kind: int = KIND_PLAIN) -> bytes:
    """Wrap a payload in a frame header.

    Args:
        payload: The payload bytes (JSON, or an encryption envelope).
        kind: ``KIND_PLAIN`` or ``KIND_ENCRYPTED``.

    Returns:
        Header plus payload, ready to append.

    Raises:
        SagaUsageError: the payload is larger than ``MAX_PAYLOAD``.
    """
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise SagaUsageError(
            f"WAL record is {n} bytes, more than the {MAX_PAYLOAD}-byte limit; "
            "store large pre-images in the snapshot store"
        )
    crc = zlib.crc32(payload, zlib.crc32(_CRC_PART.pack(VERSION, kind, n)))
    return HEADER.pack(MAGIC, VERSION, kind, n, crc) + payload


def encode_record(
    record: Mapping[str, Any], encryptor: Encryptor | None = None, salt: bytes | None = None
) -> bytes:
    """Encode one record as a complete frame.

    Args:
        record: The record (a mapping with a string ``type``).
        encryptor: When given, the JSON is sealed and written as a kind-2 frame.
        salt: When given, added as the record's last field, ``"salt"`` (ASCII bytes
            that need no JSON escaping; ``docs/log-format.md`` §12.7).

    Returns:
        The frame bytes.

    Raises:
        SagaUsageError: the record is not serialisable or too large.
    """
    payload = encode_json(record)
    if salt is not None:
        # Spliced in before the closing brace: no copy of the record on the hot path.
        payload = b"".join((payload[:-1], b',"salt":"', salt, b'"}'))
    if encryptor is None:
        return encode_frame(payload, KIND_PLAIN)
    return encode_frame(encryptor.encrypt(payload), KIND_ENCRYPTED)


HeaderCheck = tuple[Literal["ok", "bad"], int, int, int, str]
"""``(status, kind, length, crc, detail)`` as returned by :func:`check_header`."""


def check_header(header: bytes | bytearray | memoryview) -> HeaderCheck:
    """Check the crc-independent parts of a 12-byte header.

    Args:
        header: Exactly ``HEADER_SIZE`` bytes.

    Returns:
        ``("ok", kind, length, crc, "")`` or ``("bad", 0, 0, 0, why)``.
    """
    magic, version, kind, length, crc = HEADER.unpack(header)
    if magic != MAGIC:
        return ("bad", 0, 0, 0, "bad magic")
    if version != VERSION:
        return ("bad", 0, 0, 0, f"unknown version {version}")
    if kind not in (KIND_PLAIN, KIND_ENCRYPTED):
        return ("bad", 0, 0, 0, f"unknown kind {kind}")
    if length > MAX_PAYLOAD:
        return ("bad", 0, 0, 0, f"length {length} exceeds limit")
    return ("ok", kind, length, crc, "")


def header_prefix_plausible(prefix: bytes | bytearray | memoryview) -> bool:
    """Return whether ``prefix`` (shorter than a header) could start a valid header."""
    p = bytes(prefix)
    if not MAGIC.startswith(p[:2]):
        return False
    if len(p) >= 3 and p[2] != VERSION:
        return False
    return not (len(p) >= 4 and p[3] not in (KIND_PLAIN, KIND_ENCRYPTED))


def frame_crc_ok(kind: int, length: int, crc: int, payload: bytes | memoryview) -> bool:
    """Return whether the crc of a frame matches.

    Args:
        kind: The header's kind.
        length: The header's length.
        crc: The header's crc32.
        payload: The ``length`` payload bytes.

    Returns:
        True when the crc covers exactly these header fields and payload.
    """
    return zlib.crc32(payload, zlib.crc32(_CRC_PART.pack(VERSION, kind, length))) == crc


def decode_payload(payload: bytes) -> dict[str, Any] | str:
    """Parse a plaintext payload into a record.

    Args:
        payload: The JSON bytes.

    Returns:
        The record dict, or a string saying why the payload is not a record.
    """
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return f"payload is not JSON ({type(exc).__name__})"
    if not isinstance(data, dict):
        return "payload is not a JSON object"
    if not isinstance(data.get("type"), str):
        return "record has no string 'type'"
    return data
