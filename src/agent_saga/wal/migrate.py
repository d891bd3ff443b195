"""Encrypting an existing plaintext log in place (``agent-saga wal encrypt``).

A log is plaintext or encrypted, never both (``docs/log-format.md`` §1), so a log
that should be encrypted from now on is rewritten as a whole: holding the append
lock for the entire run (writers in every process wait), every record is sealed
into a new file that starts with an encrypted-mode header; the file is fsynced,
renamed over the log and the directory fsynced; then every plaintext snapshot is
re-stored sealed and its plaintext copy removed. Writers find the new inode under
the lock and re-check the mode: those without the key refuse from then on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass

from ..errors import SagaUsageError, WALCorrupted
from .format import KIND_ENCRYPTED, Encryptor, encode_frame
from .lease import ProcessLock
from .reader import Damage, Record, scan
from .snapshots import SnapshotStore, fsync_dir
from .tail import (
    FORMAT_PREALLOCATED,
    check_mode,
    data_end,
    extended_size,
    header_record,
    log_format,
    read_mode,
    write_zeros,
)

__all__ = ["EncryptReport", "encrypt_log"]


@dataclass(slots=True)
class EncryptReport:
    """What :func:`encrypt_log` did.

    Attributes:
        path: The log.
        already: The log was already encrypted with this key (nothing changed).
        records: Records sealed into the new file.
        snapshots: Plaintext snapshots re-stored sealed.
        bytes_before / bytes_after: Where the data ends (for format 2, before
            the preallocated zeros).
    """

    path: str
    already: bool = False
    records: int = 0
    snapshots: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def encrypt_log(path: str | os.PathLike[str], encryptor: Encryptor) -> EncryptReport:
    """Rewrite a plaintext log and its snapshots sealed with ``encryptor``.

    Args:
        path: The log.
        encryptor: The key to seal with (``AGENT_SAGA_WAL_KEY`` on the command line).

    Returns:
        What was done.

    Raises:
        SagaUsageError: There is no log at ``path``.
        WALCorrupted: The log is damaged (compact it with ``--force`` first: a rewrite
            must not drop bytes silently).
        WALAuthenticationFailed: The log is already encrypted with another key.
    """
    wal = os.fspath(path)
    report = EncryptReport(wal)
    if not os.path.isfile(wal):
        raise SagaUsageError(f"no WAL at {wal}")
    lock = ProcessLock(wal)
    try:
        with lock:
            fd = os.open(wal, os.O_RDONLY)
            try:
                mode = read_mode(fd)
                fmt = log_format(fd)
            finally:
                os.close(fd)
            if mode.encrypted:
                check_mode(mode, encryptor, wal)  # raises for another key
                report.already = True
            else:
                report.bytes_before = data_end(wal)
                _rewrite(wal, encryptor, report, fmt, lock)
        report.snapshots = _seal_snapshots(wal, encryptor)
    finally:
        lock.close()
    return report


def _rewrite(
    wal: str, encryptor: Encryptor, report: EncryptReport, fmt: int, lock: ProcessLock
) -> None:
    tmp = wal + ".encrypt.tmp"
    try:
        with open(tmp, "wb") as out:
            out.write(header_record(encryptor, fmt))
            for item in scan(wal):
                if isinstance(item, Damage):
                    raise WALCorrupted(
                        f"{wal} is damaged at offset {item.offset} ({item.kind}); run "
                        "`agent-saga wal compact --force` first (it saves the damaged bytes "
                        "aside), then encrypt",
                        offset=item.offset,
                        length=item.length,
                        path=wal,
                    )
                if isinstance(item, Record) and not item.meta:
                    # The payload as stored (its salt included), sealed byte for byte.
                    out.write(encode_frame(encryptor.encrypt(item.payload), KIND_ENCRYPTED))
                    report.records += 1
            out.flush()
            report.bytes_after = out.tell()
            if fmt == FORMAT_PREALLOCATED:  # the same layout, preallocated again
                used = report.bytes_after
                write_zeros(out.fileno(), used, extended_size(used, used + 1))
            os.fsync(out.fileno())
        lock.bump_generation()  # writers reopen the path (docs/log-format.md §5)
        os.replace(tmp, wal)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(wal)))


def _seal_snapshots(wal: str, encryptor: Encryptor) -> int:
    """Re-store every plaintext snapshot sealed (also finishes an interrupted run)."""
    store = SnapshotStore(wal, encryptor=encryptor)
    sealed = 0
    for saga_id in store.saga_ids():
        directory = store.root / saga_id
        for blob in sorted(directory.iterdir()):
            name = blob.name
            if not blob.is_file() or name.startswith("."):
                continue
            data = blob.read_bytes()
            if hashlib.sha256(data).hexdigest() != name:
                continue  # a sealed blob (keyed name), or a damaged one: leave it
            store.put(saga_id, data)
            blob.unlink()
            sealed += 1
        fsync_dir(directory)
    return sealed
