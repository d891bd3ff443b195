"""Writer leases, the cross-process append lock, and the table daemons read.

Layout (``docs/log-format.md`` §6)::

    <wal>.d/lock                  flock'ed by whoever appends, renews or revokes
    <wal>.d/leases/<owner>.json   {"owner","pid","host","expires","renewed",
                                   "state": "live"|"released"|"revoked","revoked_by"}

A lease file is created before its owner writes any record, so an owner seen in the
log without a lease file is dead. Lease files are replaced atomically (temp file,
then rename). Renewals and revocations both happen under the append lock, so a
renewal can never overwrite a revocation. Expiry is wall-clock time because other
processes compare it; this assumes one host whose clock does not jump by more than
the writer's safety margin. PIDs are recorded for humans only, never trusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..errors import SagaUsageError

__all__ = [
    "LeaseInfo",
    "LeaseState",
    "LeaseTable",
    "OwnLease",
    "ProcessLock",
    "lease_dir",
    "lock_path",
    "read_lease",
    "sidecar_dir",
]

LeaseState = Literal["live", "released", "revoked"]


def sidecar_dir(wal_path: str) -> str:
    """Return ``<wal>.d``, the directory beside a WAL holding its lock and leases.

    Args:
        wal_path: The WAL file path.

    Returns:
        The sidecar directory path.
    """
    return f"{wal_path}.d"


def lock_path(wal_path: str) -> str:
    """Return the path of the cross-process append lock file of a WAL.

    Args:
        wal_path: The WAL file path.

    Returns:
        ``<wal>.d/lock``.
    """
    return os.path.join(sidecar_dir(wal_path), "lock")


def lease_dir(wal_path: str) -> str:
    """Return the directory holding a WAL's lease files.

    Args:
        wal_path: The WAL file path.

    Returns:
        ``<wal>.d/leases``.
    """
    return os.path.join(sidecar_dir(wal_path), "leases")


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """The content of one lease file.

    Attributes:
        owner: The writer's owner id.
        pid: Its process id (informational: PIDs are reused, never trust them).
        host: Its host name.
        expires: Wall-clock second after which the lease is expired.
        renewed: Wall-clock second of the last renewal.
        state: ``live``, ``released`` (the owner closed cleanly) or ``revoked``.
        revoked_by: Who revoked it, when revoked.
    """

    owner: str
    pid: int
    host: str
    expires: float
    renewed: float
    state: LeaseState
    revoked_by: str | None = None


#: ``<wal>.d/lock`` holds the log's replacement generation: 8 bytes, little-endian
#: (an empty lock file is generation 0; ``docs/log-format.md`` §5).
_GENERATION = struct.Struct("<Q")


class ProcessLock:
    """The WAL's append lock: a thread lock plus ``flock`` on ``<wal>.d/lock``.

    ``flock`` excludes other processes (other open file descriptions); the thread
    lock excludes the other threads of this process, which share the descriptor.

    Args:
        wal_path: The WAL file path (the sidecar directory is created if needed).
    """

    def __init__(self, wal_path: str) -> None:
        os.makedirs(lease_dir(wal_path), exist_ok=True)
        self._fd = os.open(lock_path(wal_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._thread_lock = threading.Lock()

    def acquire(self) -> None:
        """Block until this thread holds the lock against all threads and processes."""
        self._thread_lock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise

    def release(self) -> None:
        """Release the lock taken by :meth:`acquire`."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def __enter__(self) -> ProcessLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def generation(self) -> int:
        """The log's replacement generation: bumped by whatever replaces the WAL file.

        Read holding the lock. Writers compare it before every batch instead of
        ``fstat``-ing the log: a ``stat`` of the log's inode makes the kernel's
        next write stamp a fine-grained ctime (multigrain timestamps, Linux 6.13+),
        which dirties the inode and cost each ``fdatasync`` about 75 µs on the
        reference disk (``docs/log-format.md`` §5).
        """
        raw = os.pread(self._fd, _GENERATION.size, 0)
        return _GENERATION.unpack(raw)[0] if len(raw) == _GENERATION.size else 0

    def bump_generation(self) -> None:
        """Announce that the WAL file is about to be replaced (call holding the lock).

        Compaction and ``agent-saga wal encrypt`` call it just before renaming the
        new file over the path, so every writer reopens the path at its next batch.
        Bumped first and renamed second, a crash in between costs a writer one
        needless reopen; the other order could let a writer append to the unlinked
        old file.
        """
        data = _GENERATION.pack((self.generation() + 1) & 0xFFFF_FFFF_FFFF_FFFF)
        if os.pwrite(self._fd, data, 0) != len(data):
            raise OSError(errno.EIO, "short write of the replacement generation", self._fd)

    def close(self) -> None:
        """Close the lock file descriptor (the lock must not be held)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _lease_file(wal_path: str, owner: str) -> str:
    return os.path.join(lease_dir(wal_path), f"{owner}.json")


def read_lease(wal_path: str, owner: str) -> LeaseInfo | None:
    """Read one lease file; None when missing or unreadable (which means dead)."""
    try:
        with open(_lease_file(wal_path, owner), "rb") as f:
            raw: Any = json.loads(f.read())
        return LeaseInfo(
            owner=str(raw["owner"]),
            pid=int(raw["pid"]),
            host=str(raw["host"]),
            expires=float(raw["expires"]),
            renewed=float(raw["renewed"]),
            state=raw["state"] if raw["state"] in ("live", "released", "revoked") else "revoked",
            revoked_by=raw.get("revoked_by"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_lease(wal_path: str, info: LeaseInfo) -> None:
    final = _lease_file(wal_path, info.owner)
    # Unique temp name per writer thread: two writers never share a temp file.
    tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        json.dump(asdict(info), f)
    os.replace(tmp, final)


class OwnLease:
    """The lease of one writer, as seen by that writer. Call only under the lock.

    Args:
        wal_path: The WAL file path.
        owner: The writer's owner id.
        lease_seconds: How long a renewal keeps the lease alive.
    """

    def __init__(self, wal_path: str, owner: str, lease_seconds: float) -> None:
        self._wal = wal_path
        self.owner = owner
        self._seconds = lease_seconds
        self._host = socket.gethostname()

    def write_live(self) -> None:
        """Create or renew the lease unconditionally (constructor only)."""
        now = time.time()
        _write_lease(
            self._wal,
            LeaseInfo(self.owner, os.getpid(), self._host, now + self._seconds, now, "live"),
        )

    def renew(self) -> bool:
        """Renew unless the lease was revoked or vanished.

        Returns:
            False when the writer is fenced (revoked, or its file is gone), else True.
        """
        info = read_lease(self._wal, self.owner)
        if info is None or info.state == "revoked":
            return False
        self.write_live()
        return True

    def release(self) -> None:
        """Mark the lease released (clean shutdown) unless it was revoked."""
        info = read_lease(self._wal, self.owner)
        if info is None or info.state == "revoked":
            return
        now = time.time()
        _write_lease(
            self._wal, LeaseInfo(self.owner, os.getpid(), self._host, now, now, "released")
        )


class LeaseTable:
    """Every lease of a WAL, as the recovery daemon sees them.

    Reading needs no lock; :meth:`revoke` needs the append lock, either through
    ``WALWriter.exclusive()`` (whose handle carries a locked table) or
    :meth:`locked`.

    Args:
        wal_path: The WAL file path.
    """

    def __init__(self, wal_path: str, *, _lock_held: bool = False) -> None:
        self._wal = os.path.abspath(wal_path)
        self._lock_held = _lock_held

    def get(self, owner: str) -> LeaseInfo | None:
        """Return the lease of ``owner``.

        Args:
            owner: An owner id (as found in ``saga_begin`` records).

        Returns:
            The lease, or None when there is no (readable) lease file — a dead owner.
        """
        return read_lease(self._wal, owner)

    def owners(self) -> list[str]:
        """Return the owner ids that have a lease file.

        Returns:
            Owner ids, sorted.
        """
        try:
            names = os.listdir(lease_dir(self._wal))
        except FileNotFoundError:
            return []
        return sorted(n[: -len(".json")] for n in names if n.endswith(".json"))

    def is_expired(self, owner: str, now: float | None = None) -> bool:
        """Return whether ``owner`` no longer holds a live lease.

        Expired means: no lease file, ``released`` (ended cleanly — see
        :meth:`is_released`), ``revoked``, or ``expires < now``.

        Args:
            owner: The owner id.
            now: Wall-clock seconds to judge at (default: ``time.time()``).

        Returns:
            True when the owner's sagas may be taken over.
        """
        info = read_lease(self._wal, owner)
        if info is None or info.state != "live":
            return True
        return info.expires < (time.time() if now is None else now)

    def is_released(self, owner: str) -> bool:
        """Return whether ``owner`` ended cleanly (closed its writer).

        Args:
            owner: The owner id.

        Returns:
            True only for a lease in state ``released``.
        """
        info = read_lease(self._wal, owner)
        return info is not None and info.state == "released"

    @contextlib.contextmanager
    def locked(self) -> Iterator[LeaseTable]:
        """Hold the WAL's append lock; yields a table on which :meth:`revoke` works.

        Do not use it from a process whose own writer is blocked on the same path
        in this thread (use ``WALWriter.exclusive()`` there).

        Yields:
            A locked table.
        """
        lock = ProcessLock(self._wal)
        try:
            with lock:
                yield LeaseTable(self._wal, _lock_held=True)
        finally:
            lock.close()

    def revoke(self, owner: str, by: str, now: float | None = None) -> bool:
        """Revoke an expired lease, fencing its owner out of the log.

        Args:
            owner: The owner id.
            by: Who revokes (a daemon id), recorded in the lease file.
            now: Wall-clock seconds to judge expiry at (default: ``time.time()``).

        Returns:
            True when the lease was revoked now; False when it is not expired (the
            owner is alive) or was already revoked or released.

        Raises:
            SagaUsageError: the append lock is not held by this table.
        """
        if not self._lock_held:
            raise SagaUsageError(
                "LeaseTable.revoke needs the WAL append lock: use "
                "`with table.locked() as t: t.revoke(...)` or WALWriter.exclusive()"
            )
        info = read_lease(self._wal, owner)
        if info is not None and info.state != "live":
            return False
        if info is not None and info.expires >= (time.time() if now is None else now):
            return False
        t = time.time()
        _write_lease(
            self._wal,
            LeaseInfo(
                owner,
                info.pid if info else 0,
                info.host if info else "",
                info.expires if info else t,
                info.renewed if info else t,
                "revoked",
                by,
            ),
        )
        return True
