"""Retention for the PostgreSQL log: delete the rows of sagas that are over.

The rules of what is kept are the file log's (``wal/compaction.py`` ``_decide_items``,
one implementation for both): a saga is dropped only when it has ``saga_end``, ended
longer than ``retain_seconds`` ago and has no open escalation; records the fold
cannot attribute to a saga are kept. Rows are deleted by ``seq``, below a boundary
read at the start (every seq below the committed ``next_seq`` is committed), so rows
appended meanwhile, and every row of a live saga, are never touched; seqs are never
reused and the log's identity does not change, so resuming readers go on as before.

Archive: ``archive=True`` moves the rows into the ``archive`` table in the same
transaction as the delete (atomic: archived exactly once); a path appends their
frames to that file, in the file log's archive format (frames, readable by
``agent_saga.wal.reader.scan``), fsynced before the delete (a failure after it may
leave a row archived twice, never zero times).
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any, Final

from ...errors import SagaUsageError, WALCorrupted, WALError
from .._compaction_tree import attestation_record, compaction_records, frames, plan_runs
from ..compaction import DEFAULT_RETAIN_SECONDS, CompactionReport, _decide_items, _dropped
from ..format import encode_record
from ..reader import Damage, Decryptor, Record
from ._exclusive import db_now
from ._rows import decode_row, read_log_row, scan_log
from ._schema import sql

if TYPE_CHECKING:
    from ._store import PgStore

__all__ = ["compact_pg"]

_CHUNK: Final = 5000


def compact_pg(
    store: PgStore,
    *,
    archive: bool | str | os.PathLike[str] | None,
    retain_seconds: float = DEFAULT_RETAIN_SECONDS,
    force: bool = False,
    decryptor: Decryptor | None = None,
    drop_snapshots: bool = True,
    now: float | None = None,
) -> CompactionReport:
    """Delete (or archive) the rows of sagas that are over; see the module docstring.

    Args:
        store: The PostgreSQL store.
        archive: ``None``/``False`` drops the rows; ``True`` moves them to the
            ``archive`` table; a path appends their frames to that file.
        retain_seconds: Keep sagas that ended less than this long ago.
        force: Go on despite damaged rows (they are left in place and reported).
        decryptor: Reads encrypted rows.
        drop_snapshots: Accepted for the file log's signature (a PostgreSQL log has
            no snapshot directory).
        now: Epoch seconds to measure retention against (default: the database's clock).

    Returns:
        A :class:`~agent_saga.wal.compaction.CompactionReport` (sizes in frame bytes).

    Raises:
        WALCorrupted: damaged rows and not ``force`` (nothing changed).
        WALError: another compaction of this log is running.
        SagaUsageError: ``retain_seconds`` is negative.
    """
    del drop_snapshots
    if retain_seconds < 0:
        raise SagaUsageError("retain_seconds must be >= 0")
    started = time.monotonic()
    loc = store.loc
    target: str | None
    if archive is None or archive is False:
        target = None
    elif archive is True:
        target = f"table {loc.schema}.archive"
    else:
        target = os.fspath(archive)
    report = CompactionReport(path=loc.display, archive=target)
    conn = loc.connect("compact")
    try:
        key = f"agent-saga compact {loc.schema} {loc.log}"
        locked = conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
        ).fetchone()[0]
        if not locked:
            raise WALError(f"another compaction of {loc.display} is running", path=loc.display)
        try:
            _run(conn, store, report, archive, retain_seconds, force, decryptor, now)
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
    except store._pg.Error as exc:
        raise loc.error(exc, "compacting the PostgreSQL log failed") from None
    finally:
        conn.close()
    report.seconds = time.monotonic() - started
    return report


def _run(
    conn: Any,
    store: PgStore,
    report: CompactionReport,
    archive: bool | str | os.PathLike[str] | None,
    retain_seconds: float,
    force: bool,
    decryptor: Decryptor | None,
    now: float | None,
) -> None:
    loc = store.loc
    row = read_log_row(conn, loc)
    if row is None:
        return
    now = db_now(conn) if now is None else now
    boundary = int(
        conn.execute(
            sql(loc, "SELECT next_seq FROM {s}.logs WHERE log_id = %s"), (row.log_id,)
        ).fetchone()[0]
    )
    plan = _decide_items(
        scan_log(lambda: conn, loc, 0, decryptor, row), boundary, retain_seconds, now
    )
    report.sagas_dropped, report.sagas_kept = len(plan.drop), plan.kept_sagas
    report.sagas_undoable = plan.undoable
    report.dropped_saga_ids = sorted(plan.drop)
    report.damages = list(plan.damages)
    if plan.damages and not force:
        first = plan.damages[0]
        raise WALCorrupted(
            f"{loc.display} has {len(plan.damages)} damaged row(s), the first at seq "
            f"{first.offset} ({first.detail}); run `agent-saga wal verify`, then compact "
            "with --force (damaged rows are left in place and reported)",
            offset=first.offset,
            length=first.length,
            path=loc.display,
        )
    # Pass 2: route every row below the boundary (the header is not a row).
    drop: list[tuple[int, bytes]] = []
    q = sql(
        loc,
        "SELECT seq, frame FROM {s}.records WHERE log_id = %s AND seq >= %s AND seq < %s "
        "ORDER BY seq LIMIT %s",
    )
    pos = 1
    while True:
        rows = conn.execute(q, (row.log_id, pos, boundary, _CHUNK)).fetchall()
        for seq, frame in rows:
            frame = bytes(frame)
            report.bytes_before += len(frame)
            item = decode_row(int(seq), frame, decryptor, row, loc)
            if isinstance(item, Damage):
                continue  # left in place, reported by pass 1; never counted as a record
            if _dropped(item.data, plan.drop, plan.esc_saga):
                drop.append((int(seq), frame))
                report.records_dropped += 1
            else:
                report.records_kept += 1
        if len(rows) < _CHUNK:
            break
        pos = int(rows[-1][0]) + 1
    report.bytes_after = report.bytes_before - sum(len(f) for _, f in drop)
    if not drop:
        return
    seqs = [s for s, _ in drop]
    tree_plan = plan_runs(
        scan_log(lambda: conn, loc, 0, decryptor, row),
        boundary,
        lambda data: _dropped(data, plan.drop, plan.esc_saga),
        loc.display,
    )
    by = f"compaction@{socket.gethostname()}:{os.getpid()}"
    compaction, digest = frames(compaction_records(tree_plan, by=by, now=now))
    if archive not in (None, False, True):
        assert report.archive is not None
        _append_archive_file(report.archive, [f for _, f in drop])
    with conn.transaction():
        # The append lock (the log row's): the tail is read, the rows deleted, the
        # compaction record and its attestation written as one change (§12.7).
        locked = read_log_row(conn, loc, lock=True)
        if locked is None or locked.log_id != row.log_id:
            raise WALError(f"{loc.display} was dropped during compaction", path=loc.display)
        for item in scan_log(lambda: conn, loc, boundary, decryptor, locked):
            if isinstance(item, Record):
                tree_plan.tree.add(item)
        attestation = encode_record(attestation_record(tree_plan, digest, by=by, now=now))
        for i in range(0, len(seqs), _CHUNK):
            chunk = seqs[i : i + _CHUNK]
            if archive is True:
                conn.execute(
                    sql(
                        loc,
                        "INSERT INTO {s}.archive (log_id, seq, saga, frame) SELECT log_id, seq, "
                        "saga, frame FROM {s}.records WHERE log_id = %s AND seq = ANY(%s) "
                        "ON CONFLICT DO NOTHING",
                    ),
                    (row.log_id, chunk),
                )
            conn.execute(
                sql(loc, "DELETE FROM {s}.records WHERE log_id = %s AND seq = ANY(%s)"),
                (row.log_id, chunk),
            )
        seq = conn.execute(
            sql(
                loc,
                "UPDATE {s}.logs SET header = %s, next_seq = next_seq + 1 WHERE log_id = %s "
                "RETURNING next_seq - 1",
            ),
            (locked.header + compaction, row.log_id),
        ).fetchone()[0]
        conn.execute(
            sql(
                loc, "INSERT INTO {s}.records (log_id, seq, saga, frame) VALUES (%s, %s, NULL, %s)"
            ),
            (row.log_id, seq, attestation),
        )
    report.replaced = True
    report.generation = tree_plan.generation
    report.tree_bytes = len(compaction) + len(attestation)


def _append_archive_file(path: str, frames: list[bytes]) -> None:
    """Append ``frames`` to the archive file and fsync it (created 0600 if missing)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        data = memoryview(b"".join(frames))
        while data:
            n = os.write(fd, data)
            data = data[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
