"""Reading the PostgreSQL log: the log row, its mode, and rows as records or damage.

A row's ``frame`` is a frame of ``docs/log-format.md`` §1, checked by the same
validity rule as in a file: a frame that fails it is :class:`Damage` (kind
``corrupt``) at its ``seq`` (``length`` 1: one row), never an exception. The cursor
of a row is its ``seq``; the log header (the ``logs`` row's frame) is read as the
record at cursor 0, so a scan from 0 starts with the ``log_header`` as in a file.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from ...errors import WALAuthenticationFailed, WALKeyMissing
from ..format import (
    HEADER,
    HEADER_SIZE,
    KIND_PLAIN,
    check_header,
    decode_payload,
    frame_crc_ok,
)
from ..reader import Damage, Decryptor, Record
from ..tail import KEY_CHECK, LogMode
from ._location import PgLocation
from ._schema import sql

__all__ = ["PAGE", "LogRow", "decode_row", "read_log_row", "scan_log"]

#: Rows fetched per round trip by a scan (keyset pagination on the primary key).
PAGE: Final = 1000


@dataclass(frozen=True, slots=True)
class LogRow:
    """The ``logs`` row of one log.

    Attributes:
        log_id: The log's id (the ``log`` field of its header): changes only when
            the log is dropped and created again.
        header: The header frame (a plaintext ``log_header`` record).
        encrypted: The log's mode.
        key_id: Hex key id of an encrypted log.
        key_check: The key-check envelope of an encrypted log.
        compaction: The frames of the log's ``compaction`` record (stored after the
            header in the same column: they are read right after it, before any row;
            ``docs/log-format.md`` §12.7).
    """

    log_id: str
    header: bytes
    encrypted: bool
    key_id: str | None
    key_check: bytes | None
    compaction: bytes = b""

    def mode(self) -> LogMode:
        """The log's encryption mode, for the mode rule (``tail.check_mode``)."""
        return LogMode(self.encrypted, self.key_id, self.key_check, 0, header=True)


def read_log_row(conn: Any, loc: PgLocation, *, lock: bool = False) -> LogRow | None:
    """The log's row; None when the log does not exist (the schema must exist).

    Args:
        conn: A connection.
        loc: The location.
        lock: ``SELECT ... FOR UPDATE`` (inside a transaction): the append lock.
    """
    q = "SELECT log_id, header, encrypted, key_id, key_check FROM {s}.logs WHERE name = %s"
    row = conn.execute(sql(loc, q + (" FOR UPDATE" if lock else "")), (loc.log,)).fetchone()
    if row is None:
        return None
    check: bytes | None = None
    if row[4] is not None:
        try:
            check = base64.b64decode(row[4], validate=True)
        except (binascii.Error, ValueError):
            check = None
    raw = bytes(row[1])
    end = HEADER_SIZE + int.from_bytes(raw[4:8], "little") if len(raw) >= HEADER_SIZE else 0
    return LogRow(str(row[0]), raw[:end], bool(row[2]), row[3], check, raw[end:])


def _compaction_frames(row: LogRow) -> Iterator[Record | Damage]:
    """The ``compaction`` record's frames stored after the header (cursor 0, like it)."""
    raw, pos = row.compaction, 0
    while pos + HEADER_SIZE <= len(raw):
        _, _, kind, length, crc = HEADER.unpack_from(raw, pos)
        payload = raw[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
        ok = len(payload) == length and frame_crc_ok(kind, length, crc, payload)
        data = decode_payload(payload) if ok and kind == KIND_PLAIN else None
        if not isinstance(data, dict):
            yield Damage(0, 1, "corrupt", "a compaction frame in the log row is corrupt")
            return
        yield Record(0, 1, data, KIND_PLAIN, payload)
        pos += HEADER_SIZE + length


def _decryptor_for(row: LogRow, decryptor: Decryptor | None, loc: PgLocation) -> Decryptor | None:
    """The decryptor a scan uses, checked against the header's key check up front."""
    if not row.encrypted:
        return decryptor
    if decryptor is None:
        from ..encryption import encryptor_from_env

        decryptor = encryptor_from_env()
    if decryptor is None:
        raise WALKeyMissing(
            f"{loc.display} is an encrypted log (key id {row.key_id or '?'}) and no key is "
            "configured: set AGENT_SAGA_WAL_KEY or pass an encryptor",
            path=loc.display,
        )
    try:
        opened: bytes | None = decryptor.decrypt(row.key_check or b"", offset=0)
    except WALAuthenticationFailed:
        opened = None
    if opened != KEY_CHECK:
        raise WALAuthenticationFailed(
            f"{loc.display} is encrypted with another key (key id {row.key_id or '?'}): "
            "set AGENT_SAGA_WAL_KEY to the key the log was written with",
            offset=0,
            path=loc.display,
        )
    return decryptor


def decode_row(
    seq: int,
    frame: bytes,
    decryptor: Decryptor | None,
    row: LogRow,
    loc: PgLocation,
) -> Record | Damage:
    """One row as a :class:`Record` or a :class:`Damage` (the §1 validity rule).

    Raises:
        WALKeyMissing: an encrypted row and no key.
        WALAuthenticationFailed: an encrypted row sealed with another key than the
            log's (a failed authentication under the log's own key is damage).
    """
    if len(frame) < HEADER_SIZE:
        return Damage(seq, 1, "corrupt", "row shorter than a frame header")
    status, kind, length, crc, detail = check_header(frame[:HEADER_SIZE])
    if status != "ok":
        return Damage(seq, 1, "corrupt", detail)
    if length != len(frame) - HEADER_SIZE:
        return Damage(seq, 1, "corrupt", "frame length does not match the row")
    payload = frame[HEADER_SIZE:]
    if not frame_crc_ok(kind, length, crc, payload):
        return Damage(seq, 1, "corrupt", "crc mismatch")
    if kind == KIND_PLAIN:
        data = decode_payload(payload)
    else:
        if decryptor is None:
            from ..encryption import encryptor_from_env

            decryptor = encryptor_from_env()
            if decryptor is None:
                raise WALKeyMissing(
                    f"{loc.display} holds encrypted records (first at seq {seq}) and no key "
                    "is configured: set AGENT_SAGA_WAL_KEY or pass an encryptor",
                    path=loc.display,
                )
        try:
            data = decode_payload(decryptor.decrypt(payload, offset=seq))
        except WALAuthenticationFailed as exc:
            if row.encrypted and row.key_id is not None and payload[:4].hex() == row.key_id:
                # The log's own key, checked against the header: the row was altered.
                return Damage(seq, 1, "corrupt", "failed authentication (altered row)")
            raise WALAuthenticationFailed(
                f"{loc.display}: {exc}", offset=seq, path=loc.display
            ) from None
    if isinstance(data, str):
        return Damage(seq, 1, "corrupt", data)
    data.pop("salt", None)  # the tree's, kept in the payload (docs/log-format.md §12.7)
    return Record(seq, seq + 1, data, kind, payload)


def scan_log(
    conn_of: Any,
    loc: PgLocation,
    start: int,
    decryptor: Decryptor | None,
    row: LogRow | None = None,
) -> Iterator[Record | Damage]:
    """Every record and damaged row at or after cursor ``start``, in ``seq`` order.

    Args:
        conn_of: A no-argument callable returning the connection to read with (so a
            scan abandoned half-way holds nothing open between pages).
        loc: The location.
        start: A cursor (a previous ``Record.end``); 0 includes the header.
        decryptor: Opens encrypted rows (default: ``AGENT_SAGA_WAL_KEY``).
        row: The log row, when the caller has it already.
    """
    if row is None:
        row = read_log_row(conn_of(), loc)
        if row is None:
            return
    dec = _decryptor_for(row, decryptor, loc)
    if start <= 0:
        header = decode_payload(row.header[HEADER_SIZE:])
        if isinstance(header, dict):
            yield Record(0, 1, header, KIND_PLAIN, row.header[HEADER_SIZE:])
        yield from _compaction_frames(row)
    pos = max(start, 1)
    q = sql(
        loc,
        "SELECT seq, frame FROM {s}.records WHERE log_id = %s AND seq >= %s ORDER BY seq LIMIT %s",
    )
    while True:
        rows = conn_of().execute(q, (row.log_id, pos, PAGE)).fetchall()
        for seq, frame in rows:
            yield decode_row(int(seq), bytes(frame), dec, row, loc)
        if len(rows) < PAGE:
            return
        pos = int(rows[-1][0]) + 1


def log_header_fields(frame: bytes) -> dict[str, Any]:
    """The fields of a ``log_header`` frame (as written by ``tail.header_record``)."""
    data = decode_payload(frame[HEADER_SIZE:])
    assert isinstance(data, dict)
    return data
