"""The PostgreSQL advisory lock against a real server: exclusion, fencing, dropped sessions."""

from __future__ import annotations

import logging
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from lockprocs import Holder, check_exclusive, contend, race_daemons, wait_for

from agent_saga import SagaUsageError
from agent_saga.recovery.locks_pg import PgAdvisoryLock, advisory_key


@pytest.fixture(scope="module")
def _database() -> Iterator[Callable[[str], str]]:
    """A database of this module's own on the test server, dropped at the end."""
    import psycopg

    made: list[tuple[str, str]] = []

    def get(base: str) -> str:
        if not made:
            name = f"locks_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            parts = urlsplit(base)
            made.append((base, urlunsplit((parts.scheme, parts.netloc, "/" + name, "", ""))))
        return made[0][1]

    yield get
    for base, url in made:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{urlsplit(url).path[1:]}" WITH (FORCE)')


@pytest.fixture
def pg_url(service: Callable[[str], str], _database: Callable[[str], str]) -> str:
    return _database(service("AGENT_SAGA_TEST_PG"))


@pytest.fixture
def locks(closing: Callable[[PgAdvisoryLock], PgAdvisoryLock]) -> Callable[..., PgAdvisoryLock]:
    return lambda url, **kw: closing(PgAdvisoryLock(url, **kw))


def _holder_pids(url: str, key: str) -> list[int]:
    """Backends holding the advisory lock of ``key``, from ``pg_locks``."""
    import psycopg

    k = advisory_key(key) & 0xFFFF_FFFF_FFFF_FFFF
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = %s AND objid = %s AND objsubid = 1",
            (k >> 32, k & 0xFFFF_FFFF),
        ).fetchall()
    return [r[0] for r in rows]


# --- exclusion and fencing ------------------------------------------------------------


@pytest.mark.slow
def test_processes_racing_for_a_pg_key_never_hold_it_together_and_tokens_grow(
    pg_url: str, key: str, tmp_path: Path
) -> None:
    log = tmp_path / "sections.log"
    contend(pg_url, key, log, procs=4, rounds=25, ttl=5)
    tokens = check_exclusive(log, procs=4, rounds=25)
    assert tokens == list(range(1, 101)), "one token per grant, strictly growing"


def test_a_second_session_is_refused_and_the_next_grant_has_a_greater_token(
    pg_url: str, key: str, locks: Callable[..., PgAdvisoryLock]
) -> None:
    mine, theirs = locks(pg_url), locks(pg_url)
    token = mine.acquire(key, ttl=5)
    assert token == 1
    assert mine.acquire(key, ttl=5) is None, "not re-entrant, though advisory locks stack"
    assert theirs.acquire(key, ttl=5) is None
    assert mine.held(key, token)
    assert not mine.held(key, token + 1)
    mine.release(key, token)
    assert _holder_pids(pg_url, key) == [], "released on the server, not only locally"
    assert theirs.acquire(key, ttl=5) == 2


def test_the_grant_does_not_expire_with_the_ttl_it_lives_with_the_session(
    pg_url: str, key: str, locks: Callable[..., PgAdvisoryLock]
) -> None:
    mine, theirs = locks(pg_url), locks(pg_url)
    token = mine.acquire(key, ttl=0.1)
    assert token is not None
    deadline = time.monotonic() + 1.0  # ten ttls
    while time.monotonic() < deadline:
        assert theirs.acquire(key, ttl=0.1) is None
        time.sleep(0.05)
    assert mine.held(key, token)


# --- a holder that dies, a session that drops ---------------------------------------------


@pytest.mark.slow
def test_a_sigkilled_holder_frees_the_key_at_once_whatever_its_ttl(
    pg_url: str, key: str, locks: Callable[..., PgAdvisoryLock]
) -> None:
    holder = Holder(pg_url, key, ttl=3600)
    try:
        assert holder.token == 1
        assert len(_holder_pids(pg_url, key)) == 1
        holder.kill()
        other = locks(pg_url)
        got: list[int | None] = []
        # The server ends the session when the socket closes: well before any ttl.
        wait_for(lambda: got.append(other.acquire(key, ttl=5)) or got[-1] is not None,
                 timeout=10, what="the key freed with the dead holder's session")  # fmt: skip
        assert got[-1] == 2
    finally:
        holder.close()


@pytest.mark.slow
def test_a_holder_whose_session_dropped_can_neither_keep_nor_release_the_new_grant(
    pg_url: str, key: str, locks: Callable[..., PgAdvisoryLock]
) -> None:
    import psycopg

    holder = Holder(pg_url, key, ttl=5)
    try:
        assert holder.token == 1
        [pid] = _holder_pids(pg_url, key)
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
        newer = locks(pg_url)
        got: list[int | None] = []
        wait_for(lambda: got.append(newer.acquire(key, ttl=5)) or got[-1] is not None,
                 timeout=10, what="the terminated session's lock going")  # fmt: skip
        assert got[-1] == 2
        assert holder.ask("held") is False, "the old holder knows its session is gone"
        assert holder.ask("release") == "released"
        assert newer.held(key, 2)
        assert _holder_pids(pg_url, key) == [newer_pid := _holder_pids(pg_url, key)[0]]
        assert newer_pid != pid
        assert locks(pg_url).acquire(key, ttl=5) is None, "the late release freed nothing"
    finally:
        holder.close()


def test_an_unreachable_server_makes_acquire_return_none_and_never_shows_the_password(
    locks: Callable[..., PgAdvisoryLock], caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket is closed
    secret = "pw-" + uuid.uuid4().hex
    lock = locks(f"postgresql://agent:{secret}@127.0.0.1:{port}/x", timeout=1)
    with caplog.at_level(logging.WARNING, logger="agent_saga.recovery.locks"):
        assert lock.acquire("saga", ttl=5) is None
    assert "unavailable" in caplog.text
    assert lock.last_error is not None
    assert lock.held("saga", 1) is False
    lock.release("saga", 1)  # nothing held: nothing happens, nothing raises
    shown = " ".join([repr(lock), lock.url, caplog.text, lock.last_error])
    assert secret not in shown
    assert f"postgresql://agent:***@127.0.0.1:{port}/x" in shown


def test_hostile_keys_and_table_names_are_data_not_sql(
    pg_url: str, locks: Callable[..., PgAdvisoryLock]
) -> None:
    import psycopg

    table = 'fence"; DROP TABLE agent_saga_lock_fence; --'
    evil_key = "'); DROP TABLE agent_saga_lock_fence; --"
    plain = locks(pg_url)
    assert plain.acquire("first", ttl=5) is not None  # creates the default table
    odd = locks(pg_url, table=table)
    assert odd.acquire(evil_key, ttl=5) == 1
    with psycopg.connect(pg_url, autocommit=True) as c:
        tables = {r[0] for r in c.execute("SELECT tablename FROM pg_tables").fetchall()}
        assert {"agent_saga_lock_fence", table} <= tables
        [(stored,)] = c.execute(psycopg.sql.SQL("SELECT key FROM {}").format(
            psycopg.sql.Identifier(table))).fetchall()  # fmt: skip
    assert stored == evil_key
    with pytest.raises(SagaUsageError, match=r"schema\.name"):
        PgAdvisoryLock(pg_url, table="a.b.c")


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_saga.connectors import MissingExtra

    monkeypatch.setitem(sys.modules, "psycopg", None)  # what `import psycopg` meets when absent
    with pytest.raises(MissingExtra, match=r"pip install 'sagaops-agent-saga\[postgres\]'"):
        PgAdvisoryLock("postgresql://127.0.0.1/x")


# --- the daemon -------------------------------------------------------------------------


@pytest.mark.slow
def test_two_racing_recoveryd_with_a_pg_lock_compensate_each_step_exactly_once(
    world, pg_url: str, locks: Callable[..., PgAdvisoryLock]
) -> None:
    race_daemons(world, pg_url)
    probe = locks(pg_url)
    for view in world.fold().sagas():
        token = probe.acquire(view.saga_id, ttl=5)
        assert token is not None
        assert token >= 2, "every saga was recovered under the lock"


@pytest.mark.slow
def test_a_daemon_whose_pg_session_drops_stops_before_the_next_compensation(
    world, pg_url: str
) -> None:
    import ledger_handlers
    import psycopg

    from agent_saga import register_handler
    from agent_saga._registry import unregister_handler

    result = world.agent(items=["a", "b", "c"], crash="step.after_commit", skip=2)
    assert result.returncode == -signal.SIGKILL
    world.wait_leases_expired()
    lock = PgAdvisoryLock(pg_url, timeout=2)
    daemon = world.daemon(lock=lock, claim_seconds=1.0)

    def undo_then_drop_the_session(item: str, idempotency_key: str) -> None:
        ledger_handlers.undo(item=item, idempotency_key=idempotency_key)
        saga = next(e["saga"] for e in daemon.events if e["event"] == "claimed")
        with psycopg.connect(pg_url, autocommit=True) as c:
            for pid in _holder_pids(pg_url, saga):
                c.execute("SELECT pg_terminate_backend(%s)", (pid,))

    unregister_handler("ledger.undo")
    register_handler("ledger.undo", undo_then_drop_the_session)
    try:
        daemon.run_once()
    finally:
        unregister_handler("ledger.undo")
        register_handler("ledger.undo", ledger_handlers.undo)
        lock.close()
    assert [e["event"] for e in daemon.events].count("lost-lock") == 1
    assert world.calls() == ["c"], "the daemon stopped before undoing b"
    again = PgAdvisoryLock(pg_url, timeout=2)
    try:
        second = world.daemon(lock=again, claim_seconds=1.0)
        wait_for(lambda: second.run_once().finished == 1, timeout=30, what="a takeover")
    finally:
        again.close()
    assert world.calls() == ["c", "b", "a"], "each step compensated exactly once"
    assert world.fold().non_terminal() == []
