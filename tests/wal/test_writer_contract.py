"""The writer's contract through the store API, on both backends (a file, PostgreSQL).

Every test here takes ``wal_location`` and runs twice: what it proves is the log's
contract (durability before acknowledgement, order, group commit, exclusive access,
leases, the writer's lifecycle), not a detail of one backend. Backend-specific
failure injection lives in ``test_writer.py`` (the file seam) and ``tests/wal_pg/``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agent_saga.errors import SagaUsageError
from agent_saga.wal import Damage, Record
from agent_saga.wal.store import LogStore, open_store

from ._util import rec, wait_until


def _records(store: LogStore) -> list[dict[str, Any]]:
    items = list(store.scan())
    assert not [i for i in items if isinstance(i, Damage)]
    return [i.data for i in items if isinstance(i, Record) and not i.meta]


def _another_writer(store: LogStore) -> Any:
    """A second writer on the same log, standing for another process."""
    if store.kind == "file":
        from agent_saga.wal import WALWriter

        return WALWriter(store.location)
    from agent_saga.wal.pg import PgWriter, parse_location

    return PgWriter(parse_location(store.location))


def test_an_appended_record_is_durable_and_readable_in_order(wal_location: str) -> None:
    store = open_store(wal_location)
    w = store.writer()
    try:
        for i in range(5):
            w.append(rec(i))
        assert _records(store) == [rec(i) for i in range(5)]
        assert w.stats.records_written == 5
    finally:
        w.close()


def test_submitted_records_are_written_in_order_by_the_next_flush(wal_location: str) -> None:
    store = open_store(wal_location)
    w = store.writer()
    for i in range(300):
        w.submit(rec(i))
    w.flush()
    assert _records(store) == [rec(i) for i in range(300)]
    assert w.stats.fsyncs < 300
    w.close()


def test_a_blocked_submitter_of_only_submitted_records_gets_room(wal_location: str) -> None:
    # Nobody waits for submitted records, so nothing else would wake the flusher:
    # the submitter blocked on the full queue must, or it times out with WALFull.
    store = open_store(wal_location)
    if store.kind == "file":
        from agent_saga.wal import WALWriter

        w: Any = WALWriter(store.location, queue_limit=2, backpressure="block", block_timeout=30)
    else:
        from agent_saga.wal.pg import PgWriter, parse_location

        w = PgWriter(
            parse_location(store.location), queue_limit=2, backpressure="block", block_timeout=30
        )
    try:
        for i in range(12):
            w.submit(rec(i))
        w.flush()
        assert _records(store) == [rec(i) for i in range(12)]
    finally:
        w.close()


def test_many_threads_share_commits_and_keep_each_sagas_order(wal_location: str) -> None:
    store = open_store(wal_location)
    w = store.writer()
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(25):
                w.append(rec(i, saga=f"t{t}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = _records(store)
    assert len(got) == 32 * 25
    for n in range(32):
        assert [r["step"] for r in got if r["saga"] == f"t{n}"] == list(range(25))
    assert w.stats.fsyncs < len(got)
    w.close()


async def test_256_async_tasks_share_commits(wal_location: str) -> None:
    store = open_store(wal_location)
    w = store.writer()

    async def saga(t: int) -> None:
        for i in range(10):
            await w.append_async(rec(i, saga=f"a{t}"))

    await asyncio.gather(*(saga(t) for t in range(256)))
    await w.flush_async()
    got = _records(store)
    assert len(got) == 256 * 10
    for t in (0, 100, 255):
        assert [r["step"] for r in got if r["saga"] == f"a{t}"] == list(range(10))
    assert w.stats.fsyncs < len(got) / 4
    w.close()


def test_a_submitted_record_waits_for_the_next_awaited_batch(wal_location: str) -> None:
    store = open_store(wal_location)
    w = store.writer()
    wait_until(lambda: w._flusher_idle, what="the flusher waiting for work")
    w.submit(rec(0))
    assert w._flusher_idle, "a submit does not wake the flusher"
    assert w.stats.fsyncs == 0
    assert _records(store) == []
    w.append(rec(1))
    assert (w.stats.fsyncs, w.stats.records_written) == (1, 2)
    w.submit(rec(2))
    w.flush()
    assert _records(store) == [rec(0), rec(1), rec(2)]
    w.close()


def test_exclusive_sees_every_other_writer_and_appends_under_the_lock(wal_location: str) -> None:
    store = open_store(wal_location)
    a = store.writer()
    b = _another_writer(store)
    a.append(rec(0))
    b.append(rec(1))
    with a.exclusive() as x:
        items = list(x.read_from(0))
        assert [i.data for i in items if isinstance(i, Record) and not i.meta] == [rec(0), rec(1)]
        end = items[-1].end
        x.append_locked([rec(2), rec(3)])
        assert [i.data for i in x.read_from(end) if isinstance(i, Record)] == [rec(2), rec(3)]
        assert abs(x.now() - store.now()) < 60
        with pytest.raises(SagaUsageError):
            a.append(rec(9))
    with pytest.raises(SagaUsageError):
        x.append_locked([rec(9)])
    assert [r["step"] for r in _records(store)] == [0, 1, 2, 3]
    a.close()
    b.close()


def test_a_cursor_resumes_exactly_after_the_last_record_read(wal_location: str) -> None:
    store = open_store(wal_location)
    w = store.writer()
    w.append(rec(0))
    w.append(rec(1))
    first = [i for i in store.scan() if isinstance(i, Record)]
    assert store.end() == first[-1].end
    w.append(rec(2))
    later = [i.data for i in store.scan(first[-1].end) if isinstance(i, Record)]
    assert later == [rec(2)]
    assert store.identity() is not None
    assert store.identity() == store.identity()
    w.close()


def test_one_writer_per_process_and_close_releases_the_lease(wal_location: str) -> None:
    store = open_store(wal_location)
    w1 = store.writer()
    assert open_store(wal_location).writer() is w1
    w1.append(rec(0))
    assert not store.leases().is_expired(w1.owner)
    assert w1.owner in store.leases().owners()
    w1.close()
    w1.close()
    assert store.leases().is_released(w1.owner)
    assert store.leases().is_expired(w1.owner)
    with pytest.raises(SagaUsageError):
        w1.submit(rec(1))
    w2 = store.writer()
    assert w2 is not w1
    w2.close()
