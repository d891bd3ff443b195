"""Locks for recovery: a small interface with a fencing token, and a local file lock.

A lock keeps two daemons from working on the same saga at the same time, which
saves work; it is *not* what makes recovery correct. Correctness rests on the
claim records (written under the WAL's append lock) and on deterministic
recovery tokens: a compensation run twice, even after a lost lock, has the effect
of running once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["FileLock", "Lock", "MemoryLock"]


class Lock(Protocol):
    """Mutual exclusion per key, with a fencing token that grows with every grant."""

    def acquire(self, key: str, *, ttl: float) -> int | None:
        """Try to take ``key`` for at most ``ttl`` seconds; return a fencing token or None.

        Never blocks: None means somebody else holds it.
        """
        ...

    def release(self, key: str, token: int) -> None:
        """Release ``key`` if ``token`` is still the current grant."""
        ...


class FileLock:
    """The default lock: ``flock`` on one file per key in a directory.

    The kernel drops the lock when the holding process dies, so a killed daemon never
    blocks a saga; ``ttl`` is therefore not needed and ignored. The fencing token is
    a counter kept in the lock file, incremented on every grant.

    Args:
        directory: Where the lock files live (created if missing), e.g.
            ``<wal>.d/locks``.
    """

    def __init__(self, directory: str) -> None:
        self._dir = directory  # created on first use: a daemon pointed at no WAL leaves no trace
        self._held: dict[str, int] = {}
        self._guard = threading.Lock()

    def _file(self, key: str) -> str:
        # Keys are saga ids today; hashing keeps any key a safe file name.
        return os.path.join(self._dir, hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")

    def acquire(self, key: str, *, ttl: float) -> int | None:
        """Take ``key`` unless another process (or this one) holds it."""
        with self._guard:
            if key in self._held:
                return None
            os.makedirs(self._dir, exist_ok=True)
            fd = os.open(self._file(key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            raw = os.pread(fd, 32, 0).strip()
            token = (int(raw) if raw.isdigit() else 0) + 1
            data = str(token).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            self._held[key] = fd
            return token

    def release(self, key: str, token: int) -> None:
        """Release ``key`` (the token is checked by the caller's records, not here)."""
        with self._guard:
            fd = self._held.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class MemoryLock:
    """An in-process lock with the same interface; a grant expires after its ``ttl``.

    For tests and single-process setups. Expiry is what a network lock (Redis
    ``SET NX PX``) offers: a holder that vanished without releasing blocks the key
    for at most ``ttl`` seconds; the growing token tells a late holder it was
    superseded.

    Args:
        clock: Monotonic seconds (a test seam; default ``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._held: dict[str, tuple[int, float]] = {}
        self._tokens: dict[str, int] = {}
        self._guard = threading.Lock()
        self._clock = clock

    def acquire(self, key: str, *, ttl: float) -> int | None:
        """Take ``key`` unless a grant on it is held and has not expired."""
        with self._guard:
            now = self._clock()
            held = self._held.get(key)
            if held is not None and held[1] > now:
                return None
            token = self._tokens.get(key, 0) + 1
            self._tokens[key] = token
            self._held[key] = (token, now + ttl)
            return token

    def release(self, key: str, token: int) -> None:
        """Release ``key`` if ``token`` is the current grant (a stale holder's is ignored)."""
        with self._guard:
            held = self._held.get(key)
            if held is not None and held[0] == token:
                del self._held[key]
