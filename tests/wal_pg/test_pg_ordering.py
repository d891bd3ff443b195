"""Seq order is commit order: a reader that resumes from its cursor never misses a row.

Four real writer processes (eight threads each) append at once while this process
resumes a scan from its last cursor every few milliseconds. Whatever the reader saw,
in the order it saw it, must be exactly the final full scan: no row committed below
a cursor the reader had already passed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agent_saga.wal import Record
from agent_saga.wal.store import open_store

from .conftest import read_line

pytestmark = pytest.mark.slow


def test_a_resuming_reader_sees_every_row_of_four_racing_processes(pg_log: str, spawn: Any) -> None:
    store = open_store(pg_log)
    w = store.writer()  # creates the log before the children race
    w.close()
    count = 300
    procs = [spawn({"url": pg_log, "tag": f"p{n}", "count": count}) for n in range(4)]
    seen: list[int] = []
    stop = threading.Event()
    reader_store = open_store(pg_log)

    def follow() -> None:
        cursor = 1  # past the header
        while True:
            final = stop.is_set()
            for item in reader_store.scan(cursor):
                assert isinstance(item, Record)
                seen.append(item.offset)
                cursor = item.end
            if final:
                return
            time.sleep(0.003)

    reader = threading.Thread(target=follow)
    reader.start()
    results = []
    try:
        for p in procs:
            assert read_line(p).get("ready")
        for p in procs:
            results.append(read_line(p))
            assert p.wait(120) == 0
    finally:
        stop.set()
        reader.join(60)
    full = [i.offset for i in open_store(pg_log).scan(1) if isinstance(i, Record)]
    assert len(full) == 4 * count
    assert seen == full, "the resuming reader skipped or reordered rows"
    assert full == sorted(full)
    # Group commit: each process committed fewer batches than records.
    assert all(r["records"] == count for r in results)
    assert sum(r["batches"] for r in results) < 4 * count
    reader_store.close()


def test_concurrent_appends_share_commits_counted_by_the_server(pg_log: str, admin: object) -> None:
    store = open_store(pg_log)
    w = store.writer()
    w.append({"type": "intent", "saga": "warm", "step": 0})

    def commits() -> int:
        row = admin.execute(  # type: ignore[attr-defined]
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0])

    admin.execute("SELECT pg_stat_clear_snapshot()")  # type: ignore[attr-defined]
    before = commits()
    threads = [
        threading.Thread(
            target=lambda t=t: [
                w.append({"type": "intent", "saga": f"c{t}", "step": i}) for i in range(20)
            ]
        )
        for t in range(32)
    ]
    batches_before = w.stats.batches
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batches = w.stats.batches - batches_before
    assert batches < 32 * 20 / 2, f"{batches} commits for 640 records"
    # The server agrees: far fewer transactions than records (its counters are
    # flushed asynchronously, so wait for them to include ours).
    deadline = time.monotonic() + 30
    while commits() - before < batches and time.monotonic() < deadline:
        admin.execute("SELECT pg_stat_clear_snapshot()")  # type: ignore[attr-defined]
        time.sleep(0.2)
    server = commits() - before
    assert batches <= server < 32 * 20, f"the server counted {server} commits"
    w.close()
