"""Locks for recovery: the interface, and the network lock a ``--lock URL`` names.

The interface and the locks each log location provides live with the log
(:mod:`agent_saga.wal.locks`) and are re-exported here under their documented
names. Network locks (``saga-recoveryd --lock URL``, :func:`lock_from_url`) live in
their own modules, each behind its extra: :mod:`~agent_saga.recovery.locks_redis`
(``redis://``, ``rediss://``) and :mod:`~agent_saga.recovery.locks_pg`
(``postgresql://``).
"""

from __future__ import annotations

from ..errors import SagaUsageError
from ..wal.locks import FileLock, Lock, MemoryLock, RemoteLockHealth, lock_holds, redact_url

__all__ = [
    "FileLock",
    "Lock",
    "MemoryLock",
    "RemoteLockHealth",
    "lock_from_url",
    "lock_holds",
    "redact_url",
]


def lock_from_url(url: str, *, timeout: float = 5.0) -> Lock:
    """The network lock a ``saga-recoveryd --lock URL`` names.

    Args:
        url: ``redis://[user[:password]@]host[:port][/db]``, ``rediss://…`` (TLS) or
            ``postgresql://…`` (a libpq URL; ``postgres://`` too). Passwords are best
            kept out of the URL: ``REDISCLI_AUTH`` for Redis, libpq's ``PGPASSWORD`` /
            ``~/.pgpass`` / service files for PostgreSQL.
        timeout: Seconds allowed for every call to the lock's server.

    Returns:
        A :class:`~agent_saga.recovery.locks_redis.RedisLock` or a
        :class:`~agent_saga.recovery.locks_pg.PgAdvisoryLock` (close it when done).

    Raises:
        SagaUsageError: another scheme, or a malformed URL (the message shows it
            redacted); ``MissingExtra`` when the client package is not installed.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss"):
        from .locks_redis import RedisLock

        return RedisLock(url, timeout=timeout)
    if scheme in ("postgresql", "postgres"):
        from .locks_pg import PgAdvisoryLock

        return PgAdvisoryLock(url, timeout=timeout)
    shown = redact_url(url) if scheme else "a value that is not a URL"
    raise SagaUsageError(
        f"--lock takes redis://host:port/db, rediss://… or postgresql://…, got {shown}; "
        "leave it out for the default file lock beside the WAL"
    )
