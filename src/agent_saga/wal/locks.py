"""The lock interface of the log: mutual exclusion per key, with a fencing token.

A lock keeps two daemons from working on the same saga at the same time, which
saves work; it is *not* what makes recovery correct. Correctness rests on the
claim records (written under the WAL's append lock) and on deterministic
recovery tokens: a compensation run twice, even after a lost lock, has the effect
of running once.

Each log location names its default lock (:meth:`~agent_saga.wal.store.LogStore.recovery_lock`):
a :class:`FileLock` beside a WAL file, a PostgreSQL advisory lock
(:mod:`agent_saga.wal.pg._advisory_lock`) in the database of a ``postgresql://`` log.
:class:`MemoryLock` is the in-process fake. Network locks the daemon is given with
``--lock`` build on :class:`RemoteLockHealth` (:mod:`agent_saga.recovery.locks`). A
lock that can lose a grant while it is held (a Redis TTL that ran out, a PostgreSQL
session that dropped) also has ``held(key, token) -> bool``; the daemon asks it
before every compensation, the way it re-checks its claim.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from ..secrets import redact

__all__ = [
    "FileLock",
    "Lock",
    "MemoryLock",
    "RemoteLockHealth",
    "lock_holds",
    "redact_url",
]


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


def lock_holds(lock: Lock, key: str, token: int) -> bool:
    """Whether ``lock`` still holds the grant ``token`` on ``key``.

    Asks the lock's optional ``held(key, token)``; a lock without it (a grant that
    cannot be lost while its holder lives, like :class:`FileLock`) holds until
    released.
    """
    held: Callable[[str, int], bool] | None = getattr(lock, "held", None)
    return True if held is None else bool(held(key, token))


def redact_url(url: str) -> str:
    """``url`` with its password (userinfo and query) replaced by ``***``, for printing.

    A string that does not parse as a URL is replaced whole: it may be a mistyped
    URL with a password in it.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 literal
        netloc = f"[{netloc}]"
    if port is not None:
        netloc = f"{netloc}:{port}"
    if parts.username is not None or parts.password is not None:
        user = parts.username or ""
        netloc = f"{user}{':***' if parts.password is not None else ''}@{netloc}"
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class RemoteLockHealth:
    """Reachability of a lock served over the network (a base of the Redis and PostgreSQL locks).

    One warning per outage (not one per saga), one note when the service answers
    again; :attr:`last_error` holds the last failure, redacted, for ``--once``
    reports. A subclass sets :attr:`service` and :attr:`url` and calls
    :meth:`_failed` / :meth:`_ok` around each request.

    Attributes:
        last_error: ``"Type: message"`` of the last failed request, or None once
            the service answered again.
    """

    service = "lock service"
    url: str
    last_error: str | None = None
    _warned = False

    def _failed(self, what: str, exc: BaseException) -> None:
        text = " ".join(str(redact(str(exc))).split())[:300]
        self.last_error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if not self._warned:  # once per outage, not once per saga
            self._warned = True
            _log.warning(
                "%s lock at %s unavailable (%s) during %s; sagas are skipped until it "
                "answers again",
                self.service,
                self.url,
                self.last_error,
                what,
            )

    def _ok(self) -> None:
        if self.last_error is not None:
            _log.info("%s lock at %s is reachable again", self.service, self.url)
        self.last_error = None
        self._warned = False


# The daemon's operators filter on this name; it predates the move to the log layer.
_log = logging.getLogger("agent_saga.recovery.locks")


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
        self._held: dict[str, tuple[int, int]] = {}  # key -> (fd, token)
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
            self._held[key] = (fd, token)
            return token

    def held(self, key: str, token: int) -> bool:
        """Whether this process holds ``key`` under ``token`` (a flock is never lost)."""
        with self._guard:
            grant = self._held.get(key)
        return grant is not None and grant[1] == token

    def release(self, key: str, token: int) -> None:
        """Release ``key`` (the token is checked by the caller's records, not here)."""
        with self._guard:
            grant = self._held.pop(key, None)
        if grant is not None:
            fd = grant[0]
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

    def held(self, key: str, token: int) -> bool:
        """Whether ``token`` is the current, unexpired grant on ``key``."""
        with self._guard:
            grant = self._held.get(key)
            return grant is not None and grant[0] == token and grant[1] > self._clock()

    def release(self, key: str, token: int) -> None:
        """Release ``key`` if ``token`` is the current grant (a stale holder's is ignored)."""
        with self._guard:
            held = self._held.get(key)
            if held is not None and held[0] == token:
                del self._held[key]
