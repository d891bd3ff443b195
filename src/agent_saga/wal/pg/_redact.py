"""Redaction on the PostgreSQL log: the protocol of ``wal/redaction.py``, in one transaction.

Inside the writer's ``exclusive()`` block — one transaction holding the log row's
lock, so every other append waits — the log is read, the saga's state checked, the
``redaction`` row appended, and every row of the saga (in ``records`` and in the
``archive`` table) updated to its redacted frame: the same length, the same leaf
hash (``UPDATE ... SET frame = ... WHERE log_id = ... AND seq = ...``). The block's
exit commits all of it at once, so a PostgreSQL redaction is never left half-done:
a crash rolls everything back and running it again starts afresh.

Then ``VACUUM`` (outside any transaction) lets PostgreSQL reclaim the old row
versions, so no query can read them any more; their bytes may stay in the table's
data files until the space is reused or ``VACUUM FULL`` (``vacuum_full=True``)
rewrites the table, and in the server's WAL, its archives and its backups, which
agent-saga cannot reach (``docs/redaction.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._crash import crashpoint
from ...errors import SagaUsageError, WALError
from ..format import Encryptor, encode_frame
from ..reader import Record
from ..redaction import (
    AFTER_RECORD,
    RedactionReport,
    SagaFrame,
    SagaSurvey,
    fill_report,
    redacted_frame,
    redaction_record,
)
from ._rows import decode_row, read_log_row
from ._schema import sql

if TYPE_CHECKING:
    from ._location import PgLocation
    from ._rows import LogRow
    from ._store import PgStore

__all__ = ["redact_pg"]


def redact_pg(
    store: PgStore,
    saga_id: str,
    *,
    reason: str,
    by: str,
    identity: Mapping[str, Any],
    encryptor: Encryptor | None,
    vacuum_full: bool = False,
) -> RedactionReport:
    """Redact a saga of a PostgreSQL log (see the module docstring).

    Args:
        store: The log.
        saga_id: The saga.
        reason / by / identity: What the ``redaction`` record says.
        encryptor: The log's key (an encrypted log needs it).
        vacuum_full: ``VACUUM FULL`` instead of ``VACUUM`` after the commit.

    Returns:
        The report (``vacuumed``: what ran, or why it could not).

    Raises:
        SagaUsageError: the saga is unknown or cannot be redacted yet.
        WALError: the database refused a statement (nothing was changed).
    """
    loc = store.loc
    report = RedactionReport(location=store.display, saga=saga_id)
    writer = store.writer(encryptor=encryptor)
    try:
        with writer.exclusive() as x:
            conn = x._conn_of()
            row = read_log_row(conn, loc)
            if row is None:
                raise SagaUsageError(f"saga {saga_id} is not in {store.display}: the log is empty")
            survey = SagaSurvey(saga_id)
            survey.feed(x.read_from(0))
            archived = _archived(conn, loc, row, survey, encryptor)
            if survey.redaction is not None:
                fill_report(report, survey.redaction)
                report.redaction_leaf = survey.redaction_leaf
                report.redaction_at = survey.redaction_at
                todo = survey.pending()
                report.already, report.resumed = not (todo or archived), bool(todo)
            else:
                why = survey.refusal(store.display, x.now())
                if why is not None and (survey.frames or not archived):
                    raise SagaUsageError(why)
                todo = list(survey.frames)
                record = redaction_record(survey, reason, by, identity, x.now())
                assert survey.tree is not None
                report.redaction_leaf = survey.tree.size
                x.append_locked([record])
                report.redaction_at = x.written[-1][0] if x.written else None
                fill_report(report, record)
            crashpoint(AFTER_RECORD)
            report.records = _update(conn, loc, "records", row, todo, saga_id, encryptor)
            report.archive_records = _update(
                conn, loc, "archive", row, archived, saga_id, encryptor
            )
    finally:
        writer.close()
    report.vacuumed = _vacuum(store, full=vacuum_full)
    return report


def _archived(
    conn: Any, loc: PgLocation, row: LogRow, survey: SagaSurvey, encryptor: Encryptor | None
) -> list[SagaFrame]:
    """The saga's rows in the ``archive`` table (those of the saga, and resolutions)."""
    arch = SagaSurvey(survey.saga, tree=False)
    arch.escalations |= survey.escalations
    rows = conn.execute(
        sql(
            loc,
            "SELECT seq, frame FROM {s}.archive WHERE log_id = %s AND (saga = %s OR saga IS NULL) "
            "ORDER BY seq",
        ),
        (row.log_id, survey.saga),
    ).fetchall()
    items = (decode_row(int(seq), bytes(frame), encryptor, row, loc) for seq, frame in rows)
    arch.feed(i for i in items if isinstance(i, Record))
    return arch.frames


def _update(
    conn: Any,
    loc: PgLocation,
    table: str,
    row: LogRow,
    frames: list[SagaFrame],
    saga: str,
    encryptor: Encryptor | None,
) -> int:
    """Replace each frame's row in ``table`` by its redacted frame (unchanged rows only)."""
    where = " SET frame = %s WHERE log_id = %s AND seq = %s AND frame = %s"
    template = {"records": "UPDATE {s}.records", "archive": "UPDATE {s}.archive"}[table]
    q = sql(loc, template + where)
    for f in frames:
        new = redacted_frame(f.payload, f.kind, saga, encryptor)
        cur = conn.execute(q, (new, row.log_id, f.cursor, encode_frame(f.payload, f.kind)))
        if cur.rowcount != 1:
            raise WALError(
                f"the {table} row at seq {f.cursor} changed while being redacted; nothing was "
                "changed: run the redaction again",
                path=loc.display,
            )
    return len(frames)


def _vacuum(store: PgStore, *, full: bool) -> str:
    """``VACUUM [FULL]`` the two tables; returns what ran, or why it could not."""
    loc = store.loc
    what = "VACUUM FULL" if full else "VACUUM"
    try:
        conn = loc.connect("redact")
    except WALError as exc:
        return f"not run ({exc})"
    try:
        for table in ("{s}.records", "{s}.archive"):
            conn.execute(sql(loc, f"{what} {table}"))
    except store._pg.Error as exc:
        return f"not run ({loc.describe(exc)})"
    finally:
        conn.close()
    return what
