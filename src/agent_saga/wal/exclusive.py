"""The handle ``WALWriter.exclusive()`` yields: the log, under the cross-process append lock.

Recovery and compaction use it to read what other processes appended, append
directly (bypassing the writer's queue and flusher) and revoke leases, all while
holding the lock (``docs/log-format.md`` §3-§6).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import SagaUsageError, WALWriteFailed
from .format import encode_record
from .lease import LeaseTable
from .reader import Damage, Record, scan

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
        """Return the current size of the log in bytes (where the next append lands)."""
        try:
            return os.stat(self._w.path).st_size
        except FileNotFoundError:
            return 0

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
        frames = [encode_record(r, w._encryptor) for r in records]
        data = b"".join(frames)
        with w._io_lock:
            w._ensure_lease_locked()
            try:
                w._write_locked(data)
                w._io.fsync(w._fd)
            except Exception as exc:
                w.stats.failed_batches += 1
                raise WALWriteFailed(
                    f"writing {len(frames)} record(s) to {w.path} failed ({exc!r})", path=w.path
                ) from exc
            w.stats.fsyncs += 1
            w.stats.batches += 1
            w.stats.records_written += len(frames)
            w.stats.bytes_written += len(data)
