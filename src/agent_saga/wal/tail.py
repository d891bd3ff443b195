"""The end of a log: where valid data ends, torn tails, and the log's encryption mode.

Writers call these holding the append lock, on their own descriptor, before they
append (``docs/log-format.md`` §1 "The log header", §8 "Repairing a torn tail"):

* :func:`find_end` follows valid frames from a known frame boundary (or finds one
  near the end of the file) and classifies what follows the last valid frame:
  nothing, a **torn tail** (an incomplete final frame, or zeros — the signature of a
  crash mid-write, safe to cut), or **damage** (anything else — never cut).
* :func:`repair_torn_tail` saves a torn tail's bytes beside the log and truncates it
  (format 1) or overwrites it with zeros (format 2, the preallocated layout).
* :func:`log_format` tells the layout (1: append, 2: preallocated, §11), and
  :func:`data_end` where valid data ends whatever the layout.
* :func:`read_mode` tells whether a log is plaintext or encrypted (header, or the
  kind of its first valid frame for logs written before headers existed), and
  :func:`check_mode` applies the mode rule to a writer's encryptor.

Only ``os.pread`` on the caller's descriptor: no buffering that could go stale
while other processes append.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..errors import WALAuthenticationFailed, WALEncryptionMismatch, WALKeyMissing
from .format import (
    HEADER_SIZE,
    KIND_ENCRYPTED,
    KIND_PLAIN,
    MAGIC,
    MAX_PAYLOAD,
    Encryptor,
    check_header,
    decode_payload,
    encode_record,
    frame_crc_ok,
    header_prefix_plausible,
)
from .records import LOG_HEADER, TAIL_REPAIRED
from .snapshots import write_fully

__all__ = [
    "FIRST_EXTENT",
    "FORMAT_APPEND",
    "FORMAT_PREALLOCATED",
    "KEY_CHECK",
    "MAX_EXTENT",
    "LogMode",
    "TailState",
    "check_mode",
    "data_end",
    "extended_size",
    "find_end",
    "follow_frames",
    "header_record",
    "log_format",
    "read_mode",
    "repair_record",
    "repair_torn_tail",
    "write_zeros",
]

#: The constant whose envelope (``key_check``) proves a writer holds the log's key.
KEY_CHECK: Final = b"agent-saga/wal/key-check/v1"
_WINDOWS: Final = (64 * 1024, 1024 * 1024, MAX_PAYLOAD + HEADER_SIZE + 1)
_ZERO_CHUNK: Final = 1 << 16
#: The append layout (``docs/log-format.md`` §11.1): the end of the file is the end of the log.
FORMAT_APPEND: Final = 1
#: The preallocated layout (§11.2): frames, then zeros to the end of the file.
FORMAT_PREALLOCATED: Final = 2
_ZEROS: Final = bytes(_ZERO_CHUNK)
#: A format-2 log starts this big and grows by its own size (doubling) ...
FIRST_EXTENT: Final = 64 * 1024
#: ... up to extensions of this size (docs/log-format.md §11.2 has the numbers).
MAX_EXTENT: Final = 8 * 1024 * 1024
_BIG_ZEROS: Final = bytes(1 << 20)


@dataclass(frozen=True, slots=True)
class TailState:
    """What follows the last valid frame of a log.

    Attributes:
        end: Offset just past the last valid frame (where a torn tail starts).
        size: The end of the file's data when looked at: its size (format 1), or
            just past its last non-zero byte, never before ``end`` (format 2: what
            follows is preallocated zeros).
        kind: ``"clean"`` (``end == size``), ``"torn"`` (``[end, size)`` is an
            incomplete final frame or zeros: cut it) or ``"damage"`` (leave it).
    """

    end: int
    size: int
    kind: Literal["clean", "torn", "damage"]

    @property
    def append_at(self) -> int:
        """Where the next frame goes once a torn tail is cut (after damage otherwise)."""
        return self.end if self.kind == "torn" else self.size


def _pread(fd: int, n: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _all_zero(fd: int, start: int, end: int) -> bool:
    pos = start
    while pos < end:
        chunk = _pread(fd, min(_ZERO_CHUNK, end - pos), pos)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def _valid_frame_at(fd: int, pos: int, size: int) -> int | None:
    """Return the end of the crc-valid frame at ``pos``, or None."""
    if size - pos < HEADER_SIZE:
        return None
    status, kind, length, crc, _ = check_header(_pread(fd, HEADER_SIZE, pos))
    end = pos + HEADER_SIZE + length
    if status != "ok" or end > size:
        return None
    if not frame_crc_ok(kind, length, crc, _pread(fd, length, pos + HEADER_SIZE)):
        return None
    return end


def _classify_rest(fd: int, pos: int, size: int) -> Literal["torn", "damage"]:
    """``[pos, size)`` holds no valid frame at ``pos``: is it a torn tail or damage?"""
    rest = size - pos
    head = _pread(fd, min(HEADER_SIZE, rest), pos)
    if rest < HEADER_SIZE:
        if header_prefix_plausible(head) or head.count(0) == len(head):
            return "torn"
        return "damage"
    status, _, length, _, _ = check_header(head)
    if status == "ok" and pos + HEADER_SIZE + length > size:
        return "torn"  # a header whose frame was cut short: a crash mid-write
    if _all_zero(fd, pos, size):
        return "torn"  # a size that reached the disk before its data
    return "damage"


def _next_magic(fd: int, start: int, size: int) -> int | None:
    pos = start
    while pos < size:
        buf = _pread(fd, min(_ZERO_CHUNK, size - pos), pos)
        i = buf.find(MAGIC)
        if i >= 0:
            return pos + i
        if len(buf) < len(MAGIC):
            return None
        pos += len(buf) - 1  # the last byte may be the first half of a magic
    return None


def _boundary_near_end(fd: int, size: int) -> int:
    """A frame boundary at or before the last valid frame, found without a full scan.

    Plaintext payloads never contain the magic, so a candidate there is a real frame
    start; in encrypted payloads a false candidate fails its crc (2^-32).
    """
    for window in _WINDOWS:
        start = max(0, size - window)
        if start == 0:
            return 0
        buf = _pread(fd, size - start, start)
        i = buf.find(MAGIC)
        while i >= 0:
            if _valid_frame_at(fd, start + i, size) is not None:
                return start + i
            i = buf.find(MAGIC, i + 1)
    return 0


def find_end(fd: int, *, start: int | None = None, fmt: int = FORMAT_APPEND) -> TailState:
    """Follow valid frames to the end of the data and classify what remains.

    Args:
        fd: A readable descriptor of the log.
        start: A known frame boundary (the end of the caller's last batch); None to
            find one near the end of the data.
        fmt: The log's layout (:func:`log_format`). In format 2 the zeros after the
            last frame are free space, not a tail: what lies before the last
            non-zero byte is classified exactly as format 1 classifies a file of
            that size. With a ``start``, zeros where a frame should begin are taken
            as the end without reading the rest of the file (the caller checked
            the whole tail when it attached; writers only ever write at the end).

    Returns:
        Where valid data ends and what follows it.
    """
    size = os.fstat(fd).st_size
    if fmt != FORMAT_PREALLOCATED:
        pos = start if start is not None and 0 <= start <= size else _boundary_near_end(fd, size)
        while pos < size:
            end = _valid_frame_at(fd, pos, size)
            if end is None:
                return TailState(pos, size, _classify_rest(fd, pos, size))
            pos = end
        return TailState(pos, size, "clean")
    incremental = start is not None and 0 <= start <= size
    if incremental:
        assert start is not None
        pos = start
    else:
        pos = _boundary_near_end(fd, _last_nonzero_end(fd, 0, size))
    while pos < size:
        end = _valid_frame_at(fd, pos, size)
        if end is None:
            break
        pos = end
    if pos >= size:
        return TailState(pos, pos, "clean")
    if incremental and _pread(fd, HEADER_SIZE, pos) == _ZEROS[:HEADER_SIZE]:
        return TailState(pos, pos, "clean")
    data = _last_nonzero_end(fd, pos, size)
    if data == pos:
        return TailState(pos, pos, "clean")
    return TailState(pos, data, _classify_rest(fd, pos, data))


def follow_frames(fd: int, start: int, limit: int) -> int | None:
    """Format 2, for writers: follow valid frames from ``start`` to the zeros after them.

    What a writer does before each batch (``docs/log-format.md`` §5, §11.2): from
    the end of its own last batch it reads only what other writers appended since,
    and it stats nothing.

    Args:
        fd: A readable descriptor of a format-2 log.
        start: A frame boundary (the end of the caller's last batch).
        limit: A size the file is known to have at least.

    Returns:
        The offset of the first frame header that is all zeros (``start`` when
        nobody wrote since), or None when anything else comes first — a frame that
        is not valid or crosses ``limit``; the caller then runs :func:`find_end`
        against the file's real size.
    """
    pos = start
    zeros = _ZEROS[:HEADER_SIZE]
    while pos + HEADER_SIZE <= limit:
        head = _pread(fd, HEADER_SIZE, pos)
        if head == zeros:
            return pos
        status, kind, length, crc, _ = check_header(head)
        end = pos + HEADER_SIZE + length
        if status != "ok" or end > limit:
            return None
        if not frame_crc_ok(kind, length, crc, _pread(fd, length, pos + HEADER_SIZE)):
            return None
        pos = end
    return None


def _last_nonzero_end(fd: int, floor: int, size: int) -> int:
    """Return the offset just past the last non-zero byte in ``[floor, size)``, or ``floor``."""
    pos = size
    while pos > floor:
        n = min(_ZERO_CHUNK, pos - floor)
        chunk = _pread(fd, n, pos - n)
        if len(chunk) < n:
            return pos  # the file shrank under us: take it as data, never as free space
        stripped = chunk.rstrip(b"\0")
        if stripped:
            return pos - n + len(stripped)
        pos -= n
    return floor


def extended_size(size: int, need: int) -> int:
    """The size a format-2 file grows to so that ``need`` bytes fit (§11.2).

    At least :data:`FIRST_EXTENT`; then each extension adds the file's own size
    (doubling), capped at :data:`MAX_EXTENT`; rounded up to 4 KiB.

    Args:
        size: The file's current size.
        need: The offset the data must reach.

    Returns:
        The new size (``size`` itself when ``need`` already fits).
    """
    new = max(size, FIRST_EXTENT)
    while new < need:
        new += min(new, MAX_EXTENT)
    return -(-new // 4096) * 4096


def log_format(fd: int) -> int:
    """Return the log's layout: 2 when its first frame is a format-2 header, else 1.

    Args:
        fd: A readable descriptor of the log.

    Returns:
        :data:`FORMAT_PREALLOCATED` or :data:`FORMAT_APPEND` (also for an empty
        file, a log without a header, or one whose header is damaged: format 1 reads
        the preallocated zeros as a torn tail, which loses nothing).
    """
    head = _pread(fd, HEADER_SIZE, 0)
    if len(head) < HEADER_SIZE:
        return FORMAT_APPEND
    status, kind, length, crc, _ = check_header(head)
    if status != "ok" or kind != KIND_PLAIN or length > 4096:
        return FORMAT_APPEND
    payload = _pread(fd, length, HEADER_SIZE)
    if not frame_crc_ok(kind, length, crc, payload):
        return FORMAT_APPEND
    record = decode_payload(payload)
    if (
        isinstance(record, dict)
        and record.get("type") == LOG_HEADER
        and record.get("format") == FORMAT_PREALLOCATED
    ):
        return FORMAT_PREALLOCATED
    return FORMAT_APPEND


def data_end(path: str | os.PathLike[str]) -> int:
    """Where the next frame of the log at ``path`` would go (0 when it is missing).

    The file's size for format 1 (today's meaning, torn tail included); for format 2
    the end of its data, never the end of its preallocated zeros.

    Args:
        path: The log.

    Returns:
        A byte offset.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        if log_format(fd) != FORMAT_PREALLOCATED:
            return os.fstat(fd).st_size
        return find_end(fd, fmt=FORMAT_PREALLOCATED).size
    finally:
        os.close(fd)


def repair_torn_tail(
    fd: int, path: str, tail: TailState, fmt: int = FORMAT_APPEND
) -> tuple[bytes, str]:
    """Save a torn tail's bytes to ``<wal>.d/torn/`` and cut it off the log.

    Format 1 truncates the log to ``tail.end``; format 2 overwrites the torn bytes
    with zeros (free space again) and fsyncs, so the file keeps its preallocation.

    Args:
        fd: A writable descriptor of the log (the append lock is held).
        path: The log's path.
        tail: A ``"torn"`` state from :func:`find_end`.
        fmt: The log's layout.

    Returns:
        The removed bytes and the name of the file they were saved to.
    """
    data = _pread(fd, tail.size - tail.end, tail.end)
    directory = os.path.join(f"{path}.d", "torn")
    os.makedirs(directory, exist_ok=True)
    name = f"{tail.end}-{int(time.time())}-{uuid.uuid4().hex[:8]}.bin"
    out = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_fully(out, data)
        os.fsync(out)
    finally:
        os.close(out)
    if fmt == FORMAT_PREALLOCATED:
        write_zeros(fd, tail.end, tail.size)
        os.fsync(fd)
    else:
        os.ftruncate(fd, tail.end)
    return data, name


def write_zeros(fd: int, start: int, end: int) -> None:
    """Write real zero bytes over ``[start, end)`` with ``pwrite`` (no fsync)."""
    pos = start
    while pos < end:
        n = os.pwrite(fd, memoryview(_BIG_ZEROS)[: min(len(_BIG_ZEROS), end - pos)], pos)
        if n <= 0:
            raise OSError(f"pwrite returned {n}")
        pos += n


def repair_record(tail: TailState, removed: bytes, saved: str, by: str) -> dict[str, Any]:
    """The ``tail_repaired`` record that goes first in the repairing writer's batch."""
    return {
        "type": TAIL_REPAIRED,
        "offset": tail.end,
        "length": len(removed),
        "sha256": hashlib.sha256(removed).hexdigest(),
        "saved": saved,
        "by": by,
        "ts": time.time(),
    }


# ---- the encryption mode ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogMode:
    """A log's encryption mode, as its first valid frame says.

    Attributes:
        encrypted: True for an encrypted log; None for an empty one (no mode yet).
        key_id: Hex key id, for messages.
        key_check: The header's envelope of :data:`KEY_CHECK`, or (logs without a
            header) the first encrypted frame's payload to trial-decrypt.
        offset: Where that frame is.
        header: Whether the log has a ``log_header``.
    """

    encrypted: bool | None
    key_id: str | None = None
    key_check: bytes | None = None
    offset: int = 0
    header: bool = False


def read_mode(fd: int) -> LogMode:
    """Read a log's mode from its first valid frame (header or, for old logs, its kind).

    Args:
        fd: A readable descriptor of the log.

    Returns:
        The mode; ``encrypted=None`` when the log holds no valid frame.
    """
    size = os.fstat(fd).st_size
    pos: int | None = 0
    while pos is not None and pos < size:
        if _valid_frame_at(fd, pos, size) is None:
            pos = _next_magic(fd, pos + 1, size)
            continue
        _, kind, length, _, _ = check_header(_pread(fd, HEADER_SIZE, pos))
        payload = _pread(fd, length, pos + HEADER_SIZE)
        if kind == KIND_ENCRYPTED:
            return LogMode(True, payload[:4].hex(), payload, pos)
        record = decode_payload(payload)
        if isinstance(record, dict) and record.get("type") == LOG_HEADER:
            return _mode_from_header(record, pos)
        assert kind == KIND_PLAIN
        return LogMode(False, offset=pos)
    return LogMode(None)


def _mode_from_header(record: dict[str, Any], offset: int) -> LogMode:
    if record.get("encryption") is None:
        return LogMode(False, offset=offset, header=True)
    check: bytes | None = None
    raw = record.get("key_check")
    if isinstance(raw, str):
        try:
            check = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            check = None
    key_id = record.get("key_id")
    return LogMode(True, key_id if isinstance(key_id, str) else None, check, offset, header=True)


def header_record(encryptor: Encryptor | None, fmt: int = FORMAT_APPEND) -> bytes:
    """The encoded ``log_header`` frame for a new log (always a plaintext frame).

    Args:
        encryptor: The log's encryptor (its ``key_check`` goes in), or None.
        fmt: The layout, :data:`FORMAT_APPEND` or :data:`FORMAT_PREALLOCATED`.

    Returns:
        The frame bytes.
    """
    record: dict[str, Any] = {
        "type": LOG_HEADER,
        "format": fmt,
        "log": uuid.uuid4().hex,
        "created": time.time(),
        "encryption": None,
        "key_id": None,
        "key_check": None,
    }
    if encryptor is not None:
        envelope = encryptor.encrypt(KEY_CHECK)
        record["encryption"] = "aes-256-gcm"
        record["key_id"] = envelope[:4].hex()
        record["key_check"] = base64.b64encode(envelope).decode("ascii")
    return encode_record(record)


def check_mode(mode: LogMode, encryptor: Encryptor | None, path: str) -> None:
    """Apply the mode rule: refuse a writer whose encryption does not match the log's.

    Args:
        mode: From :func:`read_mode`.
        encryptor: The writer's encryptor, or None.
        path: The log, for messages.

    Raises:
        WALKeyMissing: The log is encrypted and the writer has no key.
        WALAuthenticationFailed: The log is encrypted with another key.
        WALEncryptionMismatch: The log is plaintext and the writer has a key.
    """
    if mode.encrypted is None:
        return
    if mode.encrypted and encryptor is None:
        raise WALKeyMissing(
            f"{path} is an encrypted log (key id {mode.key_id or '?'}) and no key is "
            "configured: set AGENT_SAGA_WAL_KEY to its key; nothing was written",
            path=path,
        )
    if not mode.encrypted and encryptor is not None:
        raise WALEncryptionMismatch(
            f"{path} is a plaintext log and a WAL key is configured; refusing to mix "
            "plaintext and encrypted records. Encrypt the existing log with "
            f"`agent-saga wal encrypt --wal-path {path}`, or unset AGENT_SAGA_WAL_KEY; "
            "nothing was written",
            path=path,
        )
    if mode.encrypted and encryptor is not None:
        try:
            opened = encryptor.decrypt(mode.key_check or b"", offset=mode.offset)
        except WALAuthenticationFailed:
            opened = None
        wrong = opened is None or (mode.header and opened != KEY_CHECK)
        if wrong:
            raise WALAuthenticationFailed(
                f"{path} is encrypted with another key (key id {mode.key_id or '?'}): "
                "set AGENT_SAGA_WAL_KEY to the key the log was written with; nothing "
                "was written",
                offset=mode.offset,
                path=path,
            )
