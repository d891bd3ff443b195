"""Streaming WAL reader: valid records in file order, damage reported and skipped.

The reader never loads the whole file: it keeps a sliding window of at most one
frame plus one chunk. After a frame that fails the validity rule it searches for
the next magic from ``offset + 1`` and goes on with the first valid frame, so every
valid record before and after the damage is returned (``docs/log-format.md`` §8).

In a preallocated log (format 2, §11.2) the zeros after the last non-zero byte are
free space: the reader reports nothing there, and classifies what comes before as
it would a format-1 file that ends at that byte. Zeros *followed* by data are a hole
in the log, reported as ``corrupt`` damage like any other.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol

from ..errors import WALKeyMissing
from .format import (
    HEADER_SIZE,
    KIND_ENCRYPTED,
    KIND_PLAIN,
    MAGIC,
    check_header,
    decode_payload,
    frame_crc_ok,
    header_prefix_plausible,
)
from .records import LOG_HEADER, META_TYPES, TAIL_REPAIRED
from .tail import FORMAT_PREALLOCATED, _last_nonzero_end, log_format

__all__ = ["Damage", "Decryptor", "Record", "VerifyReport", "scan", "verify"]

_CHUNK = 1 << 20


class Decryptor(Protocol):
    """Anything that can open a kind-2 payload (see ``format.Encryptor``)."""

    def decrypt(self, blob: bytes, *, offset: int) -> bytes:
        """Return the plaintext of ``blob`` or raise ``WALAuthenticationFailed``.

        Args:
            blob: The frame payload.
            offset: The frame's offset, for the error.

        Returns:
            The record's JSON bytes.
        """
        ...


@dataclass(frozen=True, slots=True)
class Record:
    """One valid record.

    Attributes:
        offset: Byte offset of the frame's first byte.
        end: Byte offset just past the frame (where the next frame starts).
        data: The decoded record (a JSON object with a string ``type``), without
            its ``salt``: that field is for the log's Merkle tree alone and stays in
            ``payload`` (``docs/log-format.md`` §12.7).
        kind: The frame's kind (``KIND_PLAIN`` or ``KIND_ENCRYPTED``).
        payload: The frame's payload bytes as stored (the JSON of a kind-1 frame, the
            envelope of a kind-2 frame): what its leaf of the log's Merkle tree
            hashes (``docs/log-format.md`` §12.7). Not compared.
    """

    offset: int
    end: int
    data: dict[str, Any]
    kind: int = KIND_PLAIN
    payload: bytes = field(default=b"", compare=False, repr=False)

    @property
    def meta(self) -> bool:
        """True for records about the file itself (``log_header``, ``tail_repaired``)."""
        return self.data["type"] in META_TYPES


@dataclass(frozen=True, slots=True)
class Damage:
    """A damaged region the reader skipped.

    Attributes:
        offset: Byte offset where the damage starts.
        length: How many bytes were skipped.
        kind: ``"torn_tail"`` for an incomplete frame at the very end of the file
            (the signature of a crash mid-write), ``"corrupt"`` for anything else.
        detail: What was wrong with the first bad frame, for humans.
    """

    offset: int
    length: int
    kind: Literal["torn_tail", "corrupt"]
    detail: str


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify` found.

    Attributes:
        path: The file checked.
        size: Where its data ends, in bytes (0 when missing): the file's size for
            format 1, the end of the data before the preallocated zeros for format 2.
        allocated: The file's size on disk (equals ``size`` for format 1).
        format: Its layout, 1 (append) or 2 (preallocated).
        records: How many valid saga records it holds (the log's own ``log_header``
            and ``tail_repaired`` records are not counted here, only in ``by_type``).
        by_type: Valid records counted per ``type``.
        damages: Every damaged region, in file order.
        repairs: The ``tail_repaired`` records: torn tails writers cut off after a
            crash (routine, not damage).
        encrypted: Whether the log is encrypted (None when it holds no valid frame).
    """

    path: str
    size: int = 0
    allocated: int = 0
    format: int = 1
    records: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    damages: list[Damage] = field(default_factory=list)
    repairs: list[dict[str, Any]] = field(default_factory=list)
    encrypted: bool | None = None

    @property
    def ok(self) -> bool:
        """True when the file has no damage at all (a torn tail counts as damage)."""
        return not self.damages


class _Window:
    """A sliding read window over a file addressed by absolute offsets."""

    __slots__ = ("base", "buf", "eof", "f", "limit")

    def __init__(self, f: IO[bytes], start: int) -> None:
        self.f = f
        f.seek(start)
        self.base = start
        self.buf = bytearray()
        self.eof = False
        self.limit: int | None = None  # format 2: the data ends here, zeros follow

    def set_limit(self, limit: int) -> None:
        """Treat ``limit`` as the end of the file (what follows is preallocated zeros)."""
        self.limit = limit
        if self.end() >= limit:
            del self.buf[max(0, limit - self.base) :]
            self.eof = True

    def end(self) -> int:
        return self.base + len(self.buf)

    def fill(self, upto: int) -> bool:
        """Buffer bytes up to ``upto``; False when the file ends before it."""
        while self.base + len(self.buf) < upto and not self.eof:
            want = max(_CHUNK, upto - self.base - len(self.buf))
            if self.limit is not None:  # never read past a known end
                want = min(want, max(self.limit - self.base - len(self.buf), 0)) or 1
            chunk = self.f.read(want)
            if chunk:
                self.buf += chunk
                if self.limit is not None and self.end() >= self.limit:
                    self.set_limit(self.limit)
            else:
                self.eof = True
        return self.base + len(self.buf) >= upto

    def drop_before(self, offset: int) -> None:
        # Amortised: only shift the buffer once a chunk's worth is dead.
        n = offset - self.base
        if n >= _CHUNK or (n > 0 and n == len(self.buf)):
            del self.buf[:n]
            self.base = offset

    def get(self, a: int, b: int) -> bytes:
        return bytes(self.buf[a - self.base : b - self.base])

    def find_magic(self, start: int) -> int | None:
        while True:
            i = self.buf.find(MAGIC, max(0, start - self.base))
            if i >= 0:
                return self.base + i
            if self.eof:
                return None
            # Keep the last byte: it may be the first half of a magic.
            start = max(start, self.end() - 1)
            self.drop_before(start)
            self.fill(self.end() + 1)


_VALID, _INVALID, _INCOMPLETE, _EOF = 0, 1, 2, 3


def scan(
    path: str | os.PathLike[str],
    *,
    start: int = 0,
    decryptor: Decryptor | None = None,
    end: int | None = None,
) -> Iterator[Record | Damage]:
    """Yield every valid record and every damaged region of a WAL, in file order.

    Args:
        path: The WAL file. A missing file reads as empty.
        start: Byte offset to start at (a frame boundary, normally a previous
            ``Record.end``; anything else resynchronises at the next magic).
        decryptor: Opens encrypted frames. When None and an encrypted frame is met,
            the key from ``AGENT_SAGA_WAL_KEY`` is used.
        end: Where the valid data is known to end (a writer holding the append lock
            knows it): nothing at or beyond it is read.

    Yields:
        ``Record`` for each valid frame, ``Damage`` for each damaged region.

    Raises:
        WALKeyMissing: an encrypted frame was met and no key is configured.
        WALAuthenticationFailed: an encrypted frame with a valid crc failed
            authentication (wrong key or tampering).
    """
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the generator
    except FileNotFoundError:
        return
    with f:
        yield from _scan_file(f, os.fspath(path), start, decryptor, end)


def scan_open(
    f: IO[bytes], path: str, *, start: int, end: int, decryptor: Decryptor | None = None
) -> Iterator[Record | Damage]:
    """:func:`scan` of ``[start, end)`` through a file the caller keeps open (unbuffered)."""
    return _scan_file(f, path, start, decryptor, end)


def _scan_file(
    f: IO[bytes], path: str, start: int, decryptor: Decryptor | None, end: int | None = None
) -> Iterator[Record | Damage]:
    w = _Window(f, start)
    if end is not None:
        w.set_limit(end)
    pos = start
    damage_start: int | None = None
    damage_detail = ""
    torn_at: int | None = None
    # With a known end, the zeros after the data are never read: the layout is moot.
    prealloc = end is None and log_format(f.fileno()) == FORMAT_PREALLOCATED
    while True:
        w.drop_before(pos)
        status, end, detail, data, blob = _frame_at(w, pos)
        if status != _VALID and prealloc and w.limit is None:
            # Format 2: where does the data end? Zeros from here on are free space.
            last = _last_nonzero_end(f.fileno(), pos, os.fstat(f.fileno()).st_size)
            if last <= pos:
                return
            # Read again from here: the window may hold zeros that a writer in
            # another process has filled since (a frame being written would then
            # look crc-invalid, i.e. corrupt, instead of incomplete).
            w = _Window(f, pos)
            w.set_limit(last)
            status, end, detail, data, blob = _frame_at(w, pos)
        if status == _EOF:
            return  # clean end: a damaged region never reaches here (pos is a magic)
        if status == _VALID:
            if damage_start is not None:
                yield Damage(damage_start, pos - damage_start, "corrupt", damage_detail)
                damage_start, torn_at = None, None
            kind = KIND_PLAIN
            if data is None:
                kind = KIND_ENCRYPTED
                if decryptor is None:
                    decryptor = _env_decryptor(path, pos)
                data = decode_payload(decryptor.decrypt(blob, offset=pos))
            if isinstance(data, str):
                # crc-valid frame whose payload is not a record: its extent is
                # trustworthy, so skip exactly the frame instead of resyncing inside it.
                yield Damage(pos, end - pos, "corrupt", data)
            else:
                assert isinstance(data, dict)
                data.pop("salt", None)  # the tree's, kept in the payload (§12.7)
                yield Record(pos, end, data, kind, blob)
            pos = end
            continue
        if damage_start is None:
            damage_start, damage_detail = pos, detail
        if status == _INCOMPLETE and torn_at is None:
            torn_at = pos
        nxt = w.find_magic(pos + 1)
        if nxt is None:
            break
        pos = nxt
    # Only an open damaged region ends the loop, and find_magic saw end of file.
    eof = w.end()
    if torn_at is None and _zeros(f, damage_start, eof):
        # Only zeros to the end: a file size that reached the disk before its data.
        yield Damage(damage_start, eof - damage_start, "torn_tail", "zeros at end of file")
        return
    if torn_at is None:
        yield Damage(damage_start, eof - damage_start, "corrupt", damage_detail)
        return
    if torn_at > damage_start:
        yield Damage(damage_start, torn_at - damage_start, "corrupt", damage_detail)
    yield Damage(torn_at, eof - torn_at, "torn_tail", "incomplete frame at end of file")


def _zeros(f: IO[bytes], start: int, end: int) -> bool:
    f.seek(start)
    pos = start
    while pos < end:
        chunk = f.read(min(_CHUNK, end - pos))
        if not chunk or chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def _frame_at(w: _Window, pos: int) -> tuple[int, int, str, dict[str, Any] | str | None, bytes]:
    """Classify the candidate frame at ``pos``: (status, end, detail, record, payload).

    For a valid encrypted frame the record is None (decrypted by the caller); the
    payload is the frame's payload bytes when it is valid, else empty.
    """
    if not w.fill(pos + HEADER_SIZE):
        rest = w.get(pos, w.end())
        if not rest:
            return (_EOF, pos, "", None, b"")
        if header_prefix_plausible(rest):
            return (_INCOMPLETE, pos, "incomplete frame header", None, b"")
        return (_INVALID, pos, "garbage", None, b"")
    status, kind, length, crc, detail = check_header(w.get(pos, pos + HEADER_SIZE))
    if status != "ok":
        return (_INVALID, pos, detail, None, b"")
    end = pos + HEADER_SIZE + length
    if not w.fill(end):
        if w.limit is not None:
            # Format 2: a last frame whose final bytes are zeros ends past the data.
            payload = os.pread(w.f.fileno(), length, pos + HEADER_SIZE)
            if len(payload) == length and frame_crc_ok(kind, length, crc, payload):
                data = decode_payload(payload) if kind == KIND_PLAIN else None
                return (_VALID, end, "", data, payload)
        return (_INCOMPLETE, pos, "frame extends past end of file", None, b"")
    payload = w.get(pos + HEADER_SIZE, end)
    if not frame_crc_ok(kind, length, crc, payload):
        return (_INVALID, pos, "crc mismatch", None, b"")
    if kind == KIND_PLAIN:
        return (_VALID, end, "", decode_payload(payload), payload)
    return (_VALID, end, "", None, payload)


def _env_decryptor(path: str, offset: int) -> Decryptor:
    from .encryption import encryptor_from_env

    env = encryptor_from_env()
    if env is None:
        raise WALKeyMissing(
            f"{path} holds encrypted records (first at offset {offset}) and no key is "
            "configured: set AGENT_SAGA_WAL_KEY or pass an encryptor",
            path=path,
        )
    return env


def verify(path: str | os.PathLike[str], decryptor: Decryptor | None = None) -> VerifyReport:
    """Read a whole WAL and summarise it (``agent-saga wal verify``).

    Args:
        path: The WAL file (missing reads as empty).
        decryptor: As for :func:`scan`.

    Returns:
        Record counts, damages and the file size.

    Raises:
        WALKeyMissing: as for :func:`scan`.
        WALAuthenticationFailed: as for :func:`scan`.
    """
    report = VerifyReport(path=os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return report
    try:
        report.allocated = report.size = os.fstat(fd).st_size
        report.format = log_format(fd)
    finally:
        os.close(fd)
    end = 0
    for item in scan(path, decryptor=decryptor):
        end = item.end if isinstance(item, Record) else item.offset + item.length
        if isinstance(item, Record):
            t = item.data["type"]
            report.by_type[t] = report.by_type.get(t, 0) + 1
            if t == TAIL_REPAIRED:
                report.repairs.append(item.data)
            elif t == LOG_HEADER:
                report.encrypted = item.data.get("encryption") is not None
            if not item.meta:
                report.records += 1
                if report.encrypted is None:
                    report.encrypted = item.kind == KIND_ENCRYPTED
        else:
            report.damages.append(item)
    if report.format == FORMAT_PREALLOCATED:
        report.size = end
    return report
