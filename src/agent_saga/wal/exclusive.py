"""The handle ``WALWriter.exclusive()`` yields: the log, under the cross-process append lock.

Recovery and compaction use it to read what other processes appended, append
directly (bypassing the writer's queue and flusher) and revoke leases, all while
holding the lock (``docs/log-format.md`` §3-§6).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import SagaUsageError, WALWriteFailed
from .format import encode_record
from .lease import LeaseTable
from .reader import Damage, Record, scan
from .tail import data_end

if TYPE_CHECKING:
    from .writer import WALWriter

__all__ = ["ExclusiveHandle"]


class ExclusiveHandle:
    """What ``WALWriter.exclusive()`` yields: the log, under the append lock.

    Args:
        writer: The writer whose lock is held (built by ``exclusive()`` only).

    Attributes:
        leases: A lease table on which ``revoke`` works (the lock is held).
    """

    def __init__(self, writer: WALWriter) -> None:
        self._w = writer
        self._open = True
        self.leases = LeaseTable(writer.path, _lock_held=True)

    def read_from(self, offset: int) -> Iterator[Record | Damage]:
        """Scan the log from ``offset`` (a previous ``Record.end``).

        Args:
            offset: Where to start.

        Returns:
            An iterator of records and damages, as :func:`reader.scan`.
        """
        return scan(self._w.path, start=offset, decryptor=self._w._encryptor)

    def now(self) -> float:
        """The log's clock: this host's wall clock (leases and claims are judged by it)."""
        return time.time()

    def size(self) -> int:
        """Return where the next append lands: the end of the log's data in bytes.

        For a preallocated log (format 2) that is the end of its frames, not the
        size of the file (``docs/log-format.md`` §11.2).
        """
        return data_end(self._w.path)

    def repair_tail(self) -> None:
        """Repair a torn tail now (§8), so the next ``append_locked`` batch starts clean.

        A torn tail is otherwise repaired by the next batch, whose first record is
        then the ``tail_repaired`` one: a checkpoint that counted the leaves before
        its batch (``wal seal``) must not be preceded by one it did not count.

        Raises:
            WALWriteFailed: the repair record could not be written.
            SagaUsageError: used after the ``exclusive()`` block ended.
        """
        if not self._open:
            raise SagaUsageError("repair_tail used outside its exclusive() block")
        w = self._w
        with w._io_lock:
            w._ensure_lease_locked()
            try:
                repairs = w.stats.tail_repairs
                w._write_locked(b"")  # nothing but the repair record, if a tail was torn
                if w.stats.tail_repairs != repairs:
                    w._sync()
            except Exception as exc:
                raise WALWriteFailed(
                    f"repairing the torn tail of {w.path} failed ({exc!r})", path=w.path
                ) from exc

    def append_locked(self, records: list[Mapping[str, Any]]) -> None:
        """Write and fsync ``records`` now, as one batch, while holding the lock.

        Args:
            records: The records, in order.

        Raises:
            WALWriteFailed: write or fsync failed; none of them is acknowledged.
            LeaseLost: this writer is fenced; nothing was written.
            SagaUsageError: used after the ``exclusive()`` block ended.
        """
        if not self._open:
            raise SagaUsageError("append_locked used outside its exclusive() block")
        w = self._w
        frames = [encode_record(r, w._encryptor, w._salts.for_record(r)) for r in records]
        data = b"".join(frames)
        with w._io_lock:
            w._ensure_lease_locked()
            try:
                w._write_locked(data)
                w._sync()
            except Exception as exc:
                w.stats.failed_batches += 1
                raise WALWriteFailed(
                    f"writing {len(frames)} record(s) to {w.path} failed ({exc!r})", path=w.path
                ) from exc
            w.stats.fsyncs += 1
            w.stats.batches += 1
            w.stats.records_written += len(frames)
            w.stats.bytes_written += len(data)
