"""A failed commit reaches every waiter; a commit whose reply was lost is checked, not guessed.

The failures are real: the flusher's session is terminated by the server
(``pg_terminate_backend``) while its batch waits for the log row lock; a row at the
seq the batch will take makes its INSERT fail with a unique violation; and a TCP
relay between the writer and the server swallows the server's answer to a commit
that did happen, so the writer must reconnect and find out.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from agent_saga.wal import Record
from agent_saga.wal.pg import PgWriteFailed
from agent_saga.wal.store import open_store

from .conftest import wait_until


def _app(owner: str) -> str:
    return f"agent-saga writer {owner}"[:63]


def _records(url: str) -> list[dict[str, Any]]:
    store = open_store(url)
    try:
        return [i.data for i in store.scan(1) if isinstance(i, Record)]
    finally:
        store.close()


def _blocked_pid(admin: Any, owner: str) -> int | None:
    row = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (_app(owner),),
    ).fetchone()
    return None if row is None else int(row[0])


@pytest.fixture
def row_lock(pg_log_database: str) -> Iterator[Any]:
    """A session of the test's own that can hold a log's row lock (the append lock)."""
    with psycopg.connect(pg_log_database) as c:
        yield c
        c.rollback()


def _append_in_thread(w: Any, rec: dict[str, Any], out: dict[int, Any]) -> threading.Thread:
    def run() -> None:
        try:
            w.append(rec)
            out[rec["step"]] = None
        except Exception as exc:
            out[rec["step"]] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_terminated_session_fails_every_waiter_of_its_batch(
    pg_log: str, admin: Any, row_lock: Any
) -> None:
    store = open_store(pg_log)
    w = store.writer()
    w.append({"type": "intent", "saga": "s", "step": 0})
    row_lock.execute("SELECT 1 FROM agent_saga.logs WHERE log_id = %s FOR UPDATE", (w.log_id,))
    out: dict[int, Any] = {}
    first = _append_in_thread(w, {"type": "intent", "saga": "s", "step": 1}, out)
    wait_until(lambda: _blocked_pid(admin, w.owner), what="the first batch waiting for the lock")
    rest = [
        _append_in_thread(w, {"type": "intent", "saga": "s", "step": i}, out) for i in range(2, 22)
    ]
    wait_until(lambda: len(w._pending) == 20, what="20 records queued behind it")
    # Kill the first batch's session; the flusher checks, fails it, takes the 20 and
    # blocks again on a new session: kill that one too, with all 20 waiting on it.
    admin.execute("SELECT pg_terminate_backend(%s)", (_blocked_pid(admin, w.owner),))
    first.join(60)
    wait_until(lambda: not w._pending and _blocked_pid(admin, w.owner), what="batch two blocked")
    admin.execute("SELECT pg_terminate_backend(%s)", (_blocked_pid(admin, w.owner),))
    for t in rest:
        t.join(60)
    row_lock.rollback()
    assert sorted(out) == list(range(1, 22))
    for step, err in out.items():
        assert isinstance(err, PgWriteFailed), (step, err)
        assert err.outcome == "not_committed"
        assert "not in the log" in str(err)
    assert [r["step"] for r in _records(pg_log)] == [0]
    w.append({"type": "intent", "saga": "s", "step": 99})  # the writer carries on
    assert [r["step"] for r in _records(pg_log)] == [0, 99]
    w.close()


def test_a_unique_violation_fails_every_waiter_and_leaves_no_gap(
    pg_log: str, admin: Any, row_lock: Any
) -> None:
    store = open_store(pg_log)
    w = store.writer()
    w.append({"type": "intent", "saga": "s", "step": 0})
    (next_seq,) = admin.execute(
        "SELECT next_seq FROM agent_saga.logs WHERE log_id = %s", (w.log_id,)
    ).fetchone()
    admin.execute(
        "INSERT INTO agent_saga.records (log_id, seq, saga, frame) VALUES (%s, %s, 'x', '')",
        (w.log_id, next_seq),
    )
    row_lock.execute("SELECT 1 FROM agent_saga.logs WHERE log_id = %s FOR UPDATE", (w.log_id,))
    out: dict[int, Any] = {}
    first = _append_in_thread(w, {"type": "intent", "saga": "s", "step": 1}, out)
    wait_until(lambda: _blocked_pid(admin, w.owner), what="the first batch waiting")
    rest = [
        _append_in_thread(w, {"type": "intent", "saga": "s", "step": i}, out) for i in range(2, 12)
    ]
    wait_until(lambda: len(w._pending) == 10, what="10 records queued")
    row_lock.rollback()
    for t in [first, *rest]:
        t.join(60)
    assert sorted(out) == list(range(1, 12))
    for err in out.values():
        assert isinstance(err, PgWriteFailed)
        assert err.sqlstate == "23505"
    admin.execute(
        "DELETE FROM agent_saga.records WHERE log_id = %s AND seq = %s", (w.log_id, next_seq)
    )
    w.append({"type": "intent", "saga": "s", "step": 50})
    store2 = open_store(pg_log)
    seqs = [i.offset for i in store2.scan(1) if isinstance(i, Record)]
    assert seqs == [next_seq - 1, next_seq], "the failed batches left no seq behind"
    store2.close()
    w.close()


class _Relay:
    """A TCP relay to PostgreSQL that can swallow the server's next answer and hang up."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.swallow = threading.Event()
        self.swallowed = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_server and self.swallow.is_set():
                    self.swallow.clear()
                    self.swallowed.set()
                    for s in (src, dst):
                        _hang_up(s)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _hang_up(s)

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            _hang_up(s)


def _hang_up(s: socket.socket) -> None:
    # shutdown sends FIN and wakes a recv blocked in another thread; close alone does not.
    for step in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
        with contextlib.suppress(OSError):
            step()


def test_a_commit_whose_answer_was_lost_is_checked_and_acknowledged_once(
    pg_log: str,
) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(pg_log)
    relay = _Relay(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        via = pg_log.replace(f":{parts.port}/", f":{relay.port}/", 1)
        store = open_store(via)
        w = store.writer()
        w.append({"type": "intent", "saga": "s", "step": 0})
        relay.swallow.set()
        w.append({"type": "intent", "saga": "s", "step": 1})  # committed, answer lost
        assert relay.swallowed.is_set()
        assert w.stats.failed_batches == 0
        assert [r["step"] for r in _records(pg_log)] == [0, 1]  # once, not twice
        w.append({"type": "intent", "saga": "s", "step": 2})
        assert [r["step"] for r in _records(pg_log)] == [0, 1, 2]
        w.close()
        store.close()
    finally:
        relay.close()
