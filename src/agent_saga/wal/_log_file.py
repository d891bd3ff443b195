"""The WAL file under a :class:`~agent_saga.wal.writer.WALWriter`: where a batch lands, and how.

A base class of the writer (as :class:`~agent_saga.wal._queue.QueueWriter` is),
holding everything that touches the file itself, each called holding the
cross-process lock: attaching to the file and the mode rule (a new log's header,
fsynced, and its preallocation), finding where to append (after another writer's
frames, over a torn tail, in a file compaction replaced), writing a batch and
cutting a partial one back off, growing a preallocated file, and the sync
(``docs/log-format.md`` §3, §5, §11).
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from .._crash import crashpoint, is_armed
from ._batch import WriterIO, WriterStats
from .format import Encryptor, encode_record
from .lease import ProcessLock
from .snapshots import write_fully
from .tail import (
    FORMAT_APPEND,
    FORMAT_PREALLOCATED,
    check_mode,
    extended_size,
    find_end,
    follow_frames,
    header_record,
    log_format,
    read_mode,
    repair_record,
    repair_torn_tail,
    write_zeros,
)

__all__ = ["LogFile"]


class LogFile:
    """The file half of the WAL writer (a base class; :class:`WALWriter` sets the state).

    ``_fd`` is the open log, ``_format`` its layout (1 append, 2 preallocated),
    ``_known_end`` the end of valid data as of this writer's last write (None: look
    again), ``_size`` a format-2 file's preallocated size as last seen and
    ``_generation`` the lock file's replacement generation at attach.
    """

    path: str
    owner: str
    stats: WriterStats
    _io: WriterIO
    _encryptor: Encryptor | None
    _plock: ProcessLock
    _fd: int
    _format: int
    _create_format: int
    _known_end: int | None
    _size: int
    _generation: int

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        if is_armed("wal.mid_write") and len(view) > 1:
            # Crash tests: die with half of the batch written (a torn write).
            view = view[self._io.write(self._fd, view[: len(view) // 2]) :]
            crashpoint("wal.mid_write")
        while view:
            n = self._io.write(self._fd, view)
            if n <= 0:
                raise OSError(f"write returned {n}")
            view = view[n:]

    def _sync(self) -> None:
        """Make the written bytes durable: ``fdatasync`` in format 2, ``fsync`` in format 1.

        In a preallocated file a write changes neither the size nor the block map,
        so the data flush is all there is to commit (docs/log-format.md §11.2).
        """
        if self._format == FORMAT_PREALLOCATED:
            self._io.fdatasync(self._fd)
        else:
            self._io.fsync(self._fd)

    def _write_locked(self, data: bytes, prepared: bytes | None = None) -> None:
        """Append ``data`` at the end of valid data (called holding the process lock).

        A write that fails part-way is cut back off (format 1) or zeroed again
        (format 2), so a failed batch never leaves a partial frame for later batches
        to bury mid-file (docs/log-format.md §3).
        """
        # ``prepared``: what _prepare_append_locked returned to a caller that had to
        # know the end of the data first (a batch admitting metered intents).
        data = (self._prepare_append_locked() if prepared is None else prepared) + data
        start = self._known_end
        if self._format == FORMAT_PREALLOCATED:
            assert start is not None  # _prepare_append_locked always finds it in format 2
            if start + len(data) > self._size:
                self._extend_locked(start + len(data))
        try:
            self._write_all(data)
        except BaseException:
            try:
                if start is None:
                    raise OSError("no known end")
                if self._format == FORMAT_PREALLOCATED:
                    write_zeros(self._fd, start, os.lseek(self._fd, 0, os.SEEK_CUR))
                    os.lseek(self._fd, start, os.SEEK_SET)
                else:
                    os.ftruncate(self._fd, start)
            except OSError:
                self._known_end = None  # the next writer's tail check repairs it
            raise
        self._known_end = None if start is None else start + len(data)

    def _extend_locked(self, need: int) -> None:
        """Grow a format-2 file with real zeros so ``need`` fits, and fsync (§11.2).

        Called holding the process lock, so no other writer can be writing into the
        region being zeroed. On failure (``ENOSPC``) the file is cut back to its old
        size and nothing of the batch is written.
        """
        old = os.fstat(self._fd).st_size  # another writer may have extended it
        if need <= old:
            self._size = old
            return
        new = extended_size(old, need)
        try:
            if is_armed("wal.mid_extend"):
                # Crash tests: die with half of the extension written.
                write_zeros(self._fd, old, old + (new - old) // 2)
                crashpoint("wal.mid_extend")
            write_zeros(self._fd, old, new)
            os.fsync(self._fd)  # the size changed: fsync, not fdatasync
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, old)  # only our zeros lie beyond it
            raise
        self._size = new

    def _prepare_append_locked(self) -> bytes:
        """Find where to append; return frames that must go first (a repair record).

        Called holding the process lock. The replacement generation in the lock
        file tells whether compaction or a migration replaced the file (§5). In
        format 1 one ``fstat`` tells whether anyone appended since our last write
        (the size moved). In format 2 the size does not move with writes: the 12
        bytes at the end of our last batch are still zeros exactly when nobody
        wrote since, and otherwise the valid frames others appended lead to the
        zeros after them; neither case stats anything — a ``stat`` of the log
        makes the next write dirty its inode (fine-grained ctime), which slowed
        every ``fdatasync`` by about 75 µs (``docs/log-format.md`` §5).
        """
        gen = self._plock.generation()
        if gen != self._generation:
            self._generation = gen
            if self._replaced():
                self._attach_locked()
        k = self._known_end
        if self._format == FORMAT_PREALLOCATED:
            if k is not None:
                end = follow_frames(self._fd, k, self._size)
                if end == k:
                    return b""  # nobody wrote since our last batch
                if end is not None:  # others appended valid frames: follow them
                    self._known_end = end
                    os.lseek(self._fd, end, os.SEEK_SET)
                    return b""
            self._size = os.fstat(self._fd).st_size
            return self._check_tail_locked()
        if os.fstat(self._fd).st_size == k:
            return b""
        return self._check_tail_locked()

    def _check_tail_locked(self) -> bytes:
        fmt = self._format
        tail = find_end(self._fd, start=self._known_end, fmt=fmt)
        prefix = b""
        if tail.kind == "torn":
            removed, saved = repair_torn_tail(self._fd, self.path, tail, fmt)
            self.stats.tail_repairs += 1
            prefix = encode_record(repair_record(tail, removed, saved, self.owner), self._encryptor)
        self._known_end = tail.append_at
        if fmt == FORMAT_PREALLOCATED:
            os.lseek(self._fd, tail.append_at, os.SEEK_SET)
        return prefix

    def _attach_locked(self) -> None:
        """(Re)open the path and apply the mode rule before anything is written.

        Called holding the process lock, at start and after the file was replaced.
        A log with no valid frame yet gets its header now, fsynced: its mode is fixed
        before any other writer can look. An empty file becomes a log of this
        writer's ``log_format``; a format-2 log is preallocated right away.
        """
        fd = self._open()
        try:
            mode = read_mode(fd)
            check_mode(mode, self._encryptor, self.path)
            st = os.fstat(fd)
            if mode.encrypted is None and st.st_size == 0:
                fmt = self._create_format
            elif mode.encrypted is None:
                fmt = FORMAT_APPEND  # bytes but no frame: a header can only be appended
            else:
                fmt = log_format(fd)
            if fmt == FORMAT_APPEND:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        except BaseException:
            os.close(fd)
            raise
        self._generation = self._plock.generation()
        old, self._fd, self._known_end, self._format = self._fd, fd, None, fmt
        self._size = st.st_size
        if old >= 0:
            os.close(old)
        if mode.encrypted is None and fmt == FORMAT_PREALLOCATED:
            header = header_record(self._encryptor, FORMAT_PREALLOCATED)
            write_fully(self._fd, header)
            size = extended_size(0, len(header))
            write_zeros(self._fd, len(header), size)
            os.fsync(self._fd)
            self._known_end, self._size = len(header), size
        elif mode.encrypted is None:
            # Not through the test seam (self._io): opening a log is not a batch.
            write_fully(self._fd, header_record(self._encryptor) + self._check_tail_locked())
            os.fsync(self._fd)
            self._known_end = os.fstat(self._fd).st_size

    def _replaced(self) -> bool:
        try:
            return os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return True

    def _open(self) -> int:
        # O_APPEND is set by _attach_locked for format 1 only: format 2 writes at
        # the end of its data, inside the file.
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return os.open(self.path, flags)
        # A new file: make its directory entry durable too.
        dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return fd
