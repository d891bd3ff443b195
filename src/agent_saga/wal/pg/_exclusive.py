"""The lease table of a PostgreSQL log, and the handle ``PgWriter.exclusive()`` yields.

Expiry is judged on the database's clock (``clock_timestamp()``). A ``now`` passed
by a caller (a host's ``time.time()``, from code written for the file log) is only
ever used when it is *earlier* than the database's clock: a host whose clock runs
ahead can never make a live lease look expired.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import SagaUsageError
from ..format import encode_record
from ..lease import LeaseInfo, LeaseState
from ..reader import Damage, Record
from ._location import PgLocation, PgWriteFailed
from ._rows import read_log_row, scan_log
from ._schema import LEASE_LOST, sql

if TYPE_CHECKING:
    from ._writer import PgWriter

__all__ = ["PgExclusive", "PgLeaseTable", "db_now"]


def db_now(conn: Any) -> float:
    """The database's clock, in epoch seconds."""
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    return float(row[0])


class PgLeaseTable:
    """The writers' leases of one PostgreSQL log.

    Args:
        conn_of: A no-argument callable returning the connection to use.
        loc: The location.
        log_id: The log's id.
        revoking: Whether :meth:`revoke` is allowed (inside ``exclusive()`` only,
            where the log row lock is held).
    """

    def __init__(self, conn_of: Any, loc: PgLocation, log_id: str, *, revoking: bool = False):
        self._conn_of = conn_of
        self._loc = loc
        self._log_id = log_id
        self._revoking = revoking

    def get(self, owner: str) -> LeaseInfo | None:
        """The lease of ``owner``; None when there is none (a dead owner).

        ``expires`` and ``renewed`` are the database's clock, in epoch seconds.
        """
        row = (
            self._conn_of()
            .execute(
                sql(
                    self._loc,
                    "SELECT owner, pid, host, extract(epoch FROM expires)::float8, "
                    "extract(epoch FROM renewed)::float8, state, revoked_by "
                    "FROM {s}.leases WHERE log_id = %s AND owner = %s",
                ),
                (self._log_id, owner),
            )
            .fetchone()
        )
        if row is None:
            return None
        state: LeaseState = row[5] if row[5] in ("live", "released", "revoked") else "revoked"
        return LeaseInfo(str(row[0]), int(row[1]), str(row[2]), row[3], row[4], state, row[6])

    def owners(self) -> list[str]:
        """Every owner id that has a lease, sorted."""
        rows = (
            self._conn_of()
            .execute(
                sql(self._loc, "SELECT owner FROM {s}.leases WHERE log_id = %s ORDER BY owner"),
                (self._log_id,),
            )
            .fetchall()
        )
        return [str(r[0]) for r in rows]

    def is_expired(self, owner: str, now: float | None = None) -> bool:
        """Whether ``owner`` holds no live lease, judged on the database's clock.

        Args:
            owner: The owner id.
            now: Epoch seconds; used only when earlier than the database's clock.

        Returns:
            True when there is no lease, it is released or revoked, or it expired.
        """
        row = (
            self._conn_of()
            .execute(
                sql(
                    self._loc,
                    "SELECT state, expires < least(clock_timestamp(), "
                    "coalesce(to_timestamp(%s), clock_timestamp())) FROM {s}.leases "
                    "WHERE log_id = %s AND owner = %s",
                ),
                (now, self._log_id, owner),
            )
            .fetchone()
        )
        return row is None or row[0] != "live" or bool(row[1])

    def is_released(self, owner: str) -> bool:
        """Whether ``owner`` ended cleanly (closed its writer)."""
        info = self.get(owner)
        return info is not None and info.state == "released"

    def revoke(self, owner: str, by: str, now: float | None = None) -> bool:
        """Revoke an expired lease, fencing its owner out of the log.

        Args:
            owner: The owner id.
            by: Who revokes (a daemon id).
            now: Epoch seconds; used only when earlier than the database's clock.

        Returns:
            True when revoked now; False when the lease is live and not expired, or
            already revoked or released.

        Raises:
            SagaUsageError: outside ``exclusive()``.
        """
        if not self._revoking:
            raise SagaUsageError(
                "revoking a lease needs the log's append lock: use it inside "
                "writer.exclusive() (its handle's leases)"
            )
        conn = self._conn_of()
        cur = conn.execute(
            sql(
                self._loc,
                "UPDATE {s}.leases SET state = 'revoked', revoked_by = %s "
                "WHERE log_id = %s AND owner = %s AND state = 'live' AND expires < "
                "least(clock_timestamp(), coalesce(to_timestamp(%s), clock_timestamp()))",
            ),
            (by, self._log_id, owner, now),
        )
        if cur.rowcount:
            return True
        # No lease at all (a dead owner): record the revocation, as the file log does.
        cur = conn.execute(
            sql(
                self._loc,
                "INSERT INTO {s}.leases (log_id, owner, host, pid, expires, renewed, state, "
                "revoked_by) VALUES (%s, %s, '', 0, clock_timestamp(), clock_timestamp(), "
                "'revoked', %s) ON CONFLICT (log_id, owner) DO NOTHING",
            ),
            (self._log_id, owner, by),
        )
        return bool(cur.rowcount)


class PgExclusive:
    """What ``PgWriter.exclusive()`` yields: the log, with every other append waiting.

    One transaction holds the log row's lock (``SELECT ... FOR UPDATE``) for the
    whole block; ``append_locked`` inserts in that transaction and the block's exit
    commits it.

    Attributes:
        leases: The lease table, on which ``revoke`` works.
    """

    def __init__(self, writer: PgWriter, conn: Any) -> None:
        self._w = writer
        self._conn = conn
        self._open = True
        #: (first seq, frames) of every append_locked call, to check a lost COMMIT.
        self.written: list[tuple[int, list[bytes]]] = []
        #: Why the transaction is aborted (a statement failed), or None.
        self.aborted: str | None = None
        self.leases = PgLeaseTable(self._conn_of, writer.loc, writer.log_id, revoking=True)

    def _conn_of(self) -> Any:
        if not self._open:
            raise SagaUsageError("the exclusive() handle was used after its block ended")
        return self._conn

    def read_from(self, cursor: int) -> Iterator[Record | Damage]:
        """Everything committed at or after ``cursor`` (a previous ``Record.end``)."""
        row = read_log_row(self._conn_of(), self._w.loc)
        if row is None:
            return iter(())
        return scan_log(self._conn_of, self._w.loc, cursor, self._w._encryptor, row)

    def append_locked(self, records: list[Mapping[str, Any]]) -> None:
        """Insert ``records`` now, in the block's transaction, committed at its exit.

        Raises:
            LeaseLost: this writer is fenced; nothing was written (the block's
                transaction is rolled back).
            PgWriteFailed: the database refused the rows.
            SagaUsageError: used after the block ended.
        """
        conn = self._conn_of()
        w = self._w
        if w.fenced:
            raise w._lease_lost()
        if not records:
            return
        frames = [encode_record(r, w._encryptor, w._salts.for_record(r)) for r in records]
        sagas = [r.get("saga") if isinstance(r.get("saga"), str) else None for r in records]
        try:
            got = conn.execute(
                w._append_sql,
                (w.log_id, w.owner, None, w._lease_seconds, False, sagas, frames),
            ).fetchone()
        except w._pg.Error as exc:
            self.aborted = w.loc.describe(exc)
            if getattr(exc, "sqlstate", None) == LEASE_LOST:
                w._fence()
                raise w._lease_lost() from None
            raise PgWriteFailed(
                f"writing {len(frames)} record(s) to {w.path} failed: {self.aborted}",
                path=w.path,
                sqlstate=getattr(exc, "sqlstate", None),
            ) from None
        self.written.append((int(got[0]), frames))
        w.stats.records_written += len(frames)
        w.stats.bytes_written += sum(len(f) for f in frames)

    def now(self) -> float:
        """The database's clock, in epoch seconds (judge claims and leases by it)."""
        return db_now(self._conn_of())
