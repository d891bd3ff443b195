"""The PostgreSQL advisory lock for recovery daemons on several hosts (extra ``postgres``).

:class:`PgAdvisoryLock` is the default lock of a ``postgresql://`` log, so it lives
with the log it guards (:mod:`agent_saga.wal.pg._advisory_lock`, where its protocol
is described); this module keeps its documented name.
"""

from __future__ import annotations

from ..wal.pg._advisory_lock import PgAdvisoryLock, advisory_key

__all__ = ["PgAdvisoryLock", "advisory_key"]
