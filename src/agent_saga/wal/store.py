"""Where a log lives: one interface over the file WAL and the PostgreSQL log.

Every place that takes a WAL location (``saga(wal_path=...)``, ``AGENT_SAGA_WAL_PATH``,
``--wal-path`` of every command) calls :func:`open_store` and works through the
:class:`LogStore` it returns, so a ``postgresql://`` URL and a file path behave the
same (``docs/log-format.md`` §11). A *cursor* is where a reader resumes: the byte
offset of a frame in a file, the sequence number of a row in PostgreSQL. Either way
``Record.offset`` is a cursor, ``Record.end`` the cursor of whatever follows, and
cursors grow in log order.

The file backend is this module's :class:`FileStore`; the PostgreSQL backend lives in
:mod:`agent_saga.wal.pg` and is imported only when a ``postgresql://`` URL is used
(the ``postgres`` extra).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import SagaUsageError

if TYPE_CHECKING:
    from .compaction import CompactionReport
    from .format import Encryptor
    from .lease import LeaseInfo
    from .locks import Lock
    from .reader import Damage, Decryptor, Record, VerifyReport

__all__ = [
    "ExclusiveLog",
    "FileStore",
    "LeaseReader",
    "LogStore",
    "LogWriter",
    "RevokingLeases",
    "is_url",
    "open_log_writer",
    "open_store",
    "redact_location",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PG_SCHEMES = ("postgresql://", "postgres://")
_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*):[^@/?#]*@")


def is_url(location: str) -> bool:
    """Whether ``location`` has the form ``scheme://...`` rather than a file path."""
    return bool(_SCHEME.match(location))


def redact_location(location: str) -> str:
    """``location`` safe to print: a URL's password and ``password=`` parameter masked.

    Args:
        location: A file path or URL.

    Returns:
        The same text with any password replaced by ``***``.
    """
    if not is_url(location):
        return location
    out = _USERINFO_PASSWORD.sub(r"\1:***@", location)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", out)


class LeaseReader(Protocol):
    """The writers' leases of a log, as daemons and operators read them.

    Expiry is judged on the log's clock (:meth:`LogStore.now`): the file backend's is
    the host's wall clock, PostgreSQL's is the database's ``now()``.
    """

    def get(self, owner: str) -> LeaseInfo | None:
        """The lease of ``owner``; None when there is none (a dead owner)."""
        ...

    def owners(self) -> list[str]:
        """Every owner id that has a lease, sorted."""
        ...

    def is_expired(self, owner: str, now: float | None = None) -> bool:
        """Whether ``owner`` no longer holds a live lease at ``now`` (the log's clock)."""
        ...

    def is_released(self, owner: str) -> bool:
        """Whether ``owner`` ended cleanly (closed its writer)."""
        ...


class RevokingLeases(LeaseReader, Protocol):
    """A lease table inside :meth:`LogWriter.exclusive`, where revoking is allowed."""

    def revoke(self, owner: str, by: str, now: float | None = None) -> bool:
        """Revoke an expired lease, fencing its owner out of the log; True when done now."""
        ...


class ExclusiveLog(Protocol):
    """What :meth:`LogWriter.exclusive` yields: the log, with every other append excluded."""

    leases: RevokingLeases

    def read_from(self, cursor: int) -> Iterator[Record | Damage]:
        """Everything appended at or after ``cursor`` (a previous ``Record.end``)."""
        ...

    def append_locked(self, records: list[Mapping[str, Any]]) -> None:
        """Write ``records`` durably now, as one batch, before the exclusion ends."""
        ...

    def now(self) -> float:
        """The log's clock, in epoch seconds (judge claims and leases by it)."""
        ...


class LogWriter(Protocol):
    """This process's writer of one log (``saga`` runs, the daemon and the CLI use it).

    ``submit`` queues a record without waiting; ``append`` returns once it and every
    record submitted before it are durable; ``append_async`` does the same without
    blocking the event loop; ``append_fenced`` writes an escalation even after the
    writer lost its lease. ``exclusive()`` is a context manager yielding an
    :class:`ExclusiveLog`.
    """

    @property
    def owner(self) -> str:
        """The id of this writer's lease."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the writer became unusable)."""
        ...

    def submit(self, record: Mapping[str, Any]) -> None:
        """Queue ``record`` without waiting."""
        ...

    def append(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` and block until it is durable."""
        ...

    async def append_async(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` and wait, without blocking the loop, until it is durable."""
        ...

    def append_fenced(self, record: Mapping[str, Any]) -> None:
        """Write an escalation durably even after this process lost its lease."""
        ...

    def flush(self) -> None:
        """Block until every record queued so far is durable."""
        ...

    def close(self) -> None:
        """Flush, stop background work, release the lease. Idempotent."""
        ...

    def exclusive(self) -> contextlib.AbstractContextManager[ExclusiveLog]:
        """Flush, then exclude every other append (recovery claims, decisions)."""
        ...


class LogStore(Protocol):
    """One log location, opened by :func:`open_store`.

    Attributes:
        location: The location as given (never print it: a URL may hold a password).
        display: The location safe to print (:func:`redact_location`).
        kind: ``"file"`` or ``"postgresql"``.
    """

    location: str
    display: str
    kind: str

    def check(self, *, must_exist: bool) -> None:
        """Refuse a location that cannot be a log, before anything is created.

        Raises:
            SagaUsageError: a usage mistake (its message says what to do);
                :class:`~agent_saga.wal.path_check.NoWAL` when ``must_exist`` and there is
                no log there.
        """
        ...

    def exists(self) -> bool:
        """Whether a log exists at the location."""
        ...

    def writer(self, *, encryptor: Encryptor | None = None, lease_seconds: float = 30.0) -> Any:
        """This process's shared :class:`LogWriter` for the location."""
        ...

    def scan(
        self, start: int = 0, *, decryptor: Decryptor | None = None
    ) -> Iterator[Record | Damage]:
        """Every record and damaged region at or after cursor ``start``, in log order."""
        ...

    def end(self) -> int:
        """The cursor after the last record now in the log (0 when missing or empty)."""
        ...

    def identity(self) -> Hashable | None:
        """A token that changes when the log is replaced (compaction); None when missing.

        Incremental readers restart from cursor 0 when it changes.
        """
        ...

    def leases(self) -> LeaseReader:
        """The lease table (read-only outside ``exclusive()``)."""
        ...

    def now(self) -> float:
        """The log's clock in epoch seconds: leases and claims are judged by it."""
        ...

    def verify(self, decryptor: Decryptor | None = None) -> VerifyReport:
        """Check every record; report damage without stopping."""
        ...

    def compact(self, **options: Any) -> CompactionReport:
        """Drop sagas that are over (see :func:`agent_saga.wal.compaction.compact`)."""
        ...

    def recovery_lock(self) -> Lock:
        """The daemon's default per-saga lock for this location."""
        ...


class FileStore:
    """A WAL file and its ``<wal>.d`` sidecar directory (``docs/log-format.md`` §1-§10).

    Args:
        path: The WAL file's path.
    """

    kind = "file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.location = os.fspath(path)
        self.display = self.location
        self.path = os.path.abspath(self.location)

    def __repr__(self) -> str:
        return f"FileStore({self.display!r})"

    def check(self, *, must_exist: bool) -> None:
        """See :meth:`LogStore.check` (:func:`agent_saga.wal.path_check.check_wal_path`)."""
        from .path_check import check_wal_path

        check_wal_path(self.location, must_exist=must_exist)

    def exists(self) -> bool:
        """Whether the file exists."""
        return os.path.exists(self.path)

    def writer(self, *, encryptor: Encryptor | None = None, lease_seconds: float = 30.0) -> Any:
        """This process's :class:`~agent_saga.wal.writer.WALWriter` for the file."""
        from .writer import open_writer

        return open_writer(self.path, encryptor=encryptor, lease_seconds=lease_seconds)

    def scan(
        self, start: int = 0, *, decryptor: Decryptor | None = None
    ) -> Iterator[Record | Damage]:
        """See :func:`agent_saga.wal.reader.scan`."""
        from .reader import scan

        return scan(self.path, start=start, decryptor=decryptor)

    def end(self) -> int:
        """Where the next append lands: the end of the file's data.

        The file's size for format 1; for a preallocated log (format 2) the end of
        its frames, never of its zeros (``docs/log-format.md`` §11.2).
        """
        from .tail import data_end

        return data_end(self.path)

    def identity(self) -> Hashable | None:
        """The file's ``(device, inode)``: compaction renames a new file over the path."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino)

    def leases(self) -> LeaseReader:
        """The lease files in ``<wal>.d/leases``."""
        from .lease import LeaseTable

        return LeaseTable(self.path)

    def now(self) -> float:
        """The host's wall clock (one host shares one clock)."""
        return time.time()

    def verify(self, decryptor: Decryptor | None = None) -> VerifyReport:
        """See :func:`agent_saga.wal.reader.verify`."""
        from .reader import verify

        return verify(self.path, decryptor=decryptor)

    def compact(self, **options: Any) -> CompactionReport:
        """See :func:`agent_saga.wal.compaction.compact`."""
        from .compaction import compact

        return compact(self.path, **options)

    def recovery_lock(self) -> Lock:
        """A :class:`~agent_saga.wal.locks.FileLock` in ``<wal>.d/locks``."""
        from .lease import sidecar_dir
        from .locks import FileLock

        return FileLock(os.path.join(sidecar_dir(self.path), "locks"))


def open_store(location: str | os.PathLike[str] | LogStore) -> LogStore:
    """Return the store of a WAL location: a file path or a ``postgresql://`` URL.

    Args:
        location: A path, a ``postgresql://`` / ``postgres://`` URL (the ``postgres``
            extra), or a store (returned as is).

    Returns:
        The store. Nothing is opened or created yet.

    Raises:
        SagaUsageError: another URL scheme, or the extra is missing.
    """
    if not isinstance(location, str | os.PathLike):
        return location
    text = os.fspath(location)
    if not isinstance(text, str):
        raise SagaUsageError("a WAL location must be text, not bytes")
    if text.lower().startswith(_PG_SCHEMES):
        from .pg import open_pg_store  # psycopg is imported only here (extra 'postgres')

        store: LogStore = open_pg_store(text)
        return store
    if is_url(text):
        scheme = text.split("://", 1)[0]
        # Never echo the rest: a URL may carry a password.
        raise SagaUsageError(
            f"WAL location {scheme}://...: only file paths and postgresql:// URLs are supported"
        )
    return FileStore(text)


def open_log_writer(
    location: str | os.PathLike[str],
    *,
    encryptor: Encryptor | None = None,
    lease_seconds: float = 30.0,
) -> Any:
    """This process's shared writer for ``location`` (what a saga's first record opens).

    The same as ``open_store(location).writer(...)``, without building a store for a
    file path (this runs once per saga).

    Args:
        location: A file path or a ``postgresql://`` URL.
        encryptor: Seals every record (default: ``AGENT_SAGA_WAL_KEY``).
        lease_seconds: The writer's lease duration.

    Returns:
        A :class:`LogWriter`.
    """
    w = _file_writers.get(location) if type(location) is str else None
    if w is not None and not w.closed:
        return w  # every saga's first record: one dict read
    if isinstance(location, str) and not is_url(location):
        from .writer import open_writer

        w = open_writer(location, encryptor=encryptor, lease_seconds=lease_seconds)
        if os.path.isabs(location):  # a relative path names another file after a chdir
            _file_writers[location] = w
        return w
    return open_store(location).writer(encryptor=encryptor, lease_seconds=lease_seconds)


#: Absolute file locations -> the writer ``open_writer`` returned for them (a front for
#: its registry, which resolves the path first; a closed writer is looked up again).
_file_writers: dict[str, Any] = {}
