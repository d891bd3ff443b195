"""PostgreSQL connector against a real server: undo of update/insert/delete/upsert on
compound keys of mixed types, guarded restores, concurrent writers, resolution, and
bad input refused before any side effect."""

from __future__ import annotations

import datetime as dt
import functools
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga import CompensationFailed, SecretInKwargs, saga
from agent_saga.connectors import (
    CredentialRef,
    InvalidTarget,
    MissingExtra,
    TargetChanged,
    set_credential_resolver,
)
from agent_saga.connectors import postgres as pgc
from agent_saga.errors import NoActiveSaga, SagaUsageError
from agent_saga.wal.state import fold_file

SECRET = "sk_" + "live_" + "aB3dE5gH7jK9mN1pQ2rS4tU6"
TS = "2026-03-01 10:00:00+00"

DDL = """
DROP TABLE IF EXISTS orders;
CREATE TABLE orders (
    region text NOT NULL,
    n integer NOT NULL,
    placed timestamptz NOT NULL,
    status text,
    qty integer,
    meta jsonb,
    tags text[],
    note text,
    PRIMARY KEY (region, n, placed)
);
INSERT INTO orders VALUES
  ('eu', 1, '2026-03-01 10:00:00+00', 'new', 3, '{"gift": true, "lines": [1, 2]}',
   '{a,b}', NULL),
  ('eu', 2, '2026-03-01 10:00:00+00', 'new', NULL, NULL, '{}', 'second'),
  ('us', 1, '2026-03-01 10:00:00+00', 'paid', 1, '[]', NULL, NULL);
"""

KEY = {"region": "eu", "n": 1, "placed": TS}


class Boom(Exception):
    pass


def rows(pg: Any) -> list[tuple[Any, ...]]:
    return pg.execute("SELECT * FROM orders ORDER BY region, n").fetchall()


@pytest.fixture
def orders(pg: Any) -> Any:
    pg.execute(DDL)
    return pg


def fail_after(wal: Path, body: Any) -> None:
    with pytest.raises(Boom), saga("pg-test", wal_path=str(wal)):
        body()
        raise Boom


# ---- undo through real sagas -----------------------------------------------------------


def test_failed_saga_restores_update_insert_and_delete_exactly(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    before = rows(orders)

    def body() -> None:
        out = pgc.update_row(
            pg_dsn,
            "orders",
            KEY,
            {"status": "shipped", "qty": None, "meta": {"gift": False}, "tags": ["x", None]},
        )
        assert out["before"] == {
            "status": "new",
            "qty": "3",
            "meta": '{"gift": true, "lines": [1, 2]}',
            "tags": "{a,b}",
        }
        assert out["after"]["tags"] == "{x,NULL}"
        pgc.insert_row(
            pg_dsn,
            "orders",
            {"region": "eu", "n": 9, "placed": "2026-03-02T00:00:00+02:00", "status": "new"},
        )
        pgc.delete_row(pg_dsn, "orders", {"region": "us", "n": 1, "placed": TS})
        assert len(rows(orders)) == 3
        assert rows(orders)[0][3] == "shipped"

    fail_after(tmp_path / "a.wal", body)
    assert rows(orders) == before


def test_committed_saga_keeps_its_changes(orders: Any, pg_dsn: str, tmp_path: Path) -> None:
    with saga("pg-commit", wal_path=str(tmp_path / "c.wal")):
        pgc.update_row(pg_dsn, "orders", KEY, {"status": "shipped"})
    assert rows(orders)[0][3] == "shipped"


def test_upsert_updates_an_existing_row_and_inserts_a_missing_one(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    before = rows(orders)

    def body() -> None:
        updated = pgc.upsert_row(pg_dsn, "orders", KEY, {"status": "held"})
        assert updated["after"] == {"status": "held"}
        inserted = pgc.upsert_row(
            pg_dsn, "orders", {"region": "jp", "n": 1, "placed": TS}, {"status": "new"}
        )
        assert inserted["key"] == {"region": "jp", "n": "1", "placed": TS}
        assert len(rows(orders)) == 4

    fail_after(tmp_path / "u.wal", body)
    assert rows(orders) == before


async def test_async_tools_are_undone_by_an_async_saga(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    before = rows(orders)
    with pytest.raises(Boom):
        async with saga("pg-async", wal_path=str(tmp_path / "async.wal")):
            await pgc.update_row_async(pg_dsn, "orders", KEY, {"note": "async"})
            await pgc.insert_row_async(
                pg_dsn, "orders", {"region": "br", "n": 1, "placed": TS, "meta": [1, {"a": 2}]}
            )
            await pgc.delete_row_async(pg_dsn, "orders", {"region": "eu", "n": 2, "placed": TS})
            await pgc.upsert_row_async(pg_dsn, "orders", KEY, {"qty": 42})
            assert len(rows(orders)) == 3
            raise Boom
    assert rows(orders) == before


def test_generated_key_insert_is_undone_by_the_key_the_database_returned(
    pg: Any, pg_dsn: str, tmp_path: Path
) -> None:
    pg.execute(
        "DROP TABLE IF EXISTS events; CREATE TABLE events (id bigint GENERATED ALWAYS AS "
        "IDENTITY PRIMARY KEY, kind text, doubled int GENERATED ALWAYS AS (length(kind) * 2) "
        "STORED)"
    )
    pg.execute("INSERT INTO events (kind) VALUES ('keep')")

    def body() -> None:
        out = pgc.insert_row(pg_dsn, "events", {"kind": "temp"})
        assert out["key"] == {"id": "2"}
        pgc.delete_row(pg_dsn, "events", {"id": 1})

    fail_after(tmp_path / "g.wal", body)
    assert pg.execute("SELECT id, kind, doubled FROM events").fetchall() == [(1, "keep", 8)]


# ---- restore and resolve, called as the daemon calls them -----------------------------


def comp_of(wal: Path) -> dict[str, Any]:
    fold, _ = fold_file(str(wal))
    (view,) = list(fold.sagas())
    (step,) = view.steps.values()
    assert step.handler == "postgres.restore"
    return dict(step.compensation_kwargs)


def committed_update(pg_dsn: str, wal: Path, values: dict[str, Any]) -> dict[str, Any]:
    with saga("pg-commit", wal_path=str(wal)):
        pgc.update_row(pg_dsn, "orders", KEY, values)
    return comp_of(wal)


def test_restore_twice_is_restore_once(orders: Any, pg_dsn: str, tmp_path: Path) -> None:
    before = rows(orders)
    kw = committed_update(pg_dsn, tmp_path / "r.wal", {"status": "shipped", "tags": ["z"]})
    first = pgc.restore(**kw, idempotency_key="tok")
    assert (first.verified, first.detail["outcome"]) == (True, "restored")
    again = pgc.restore(**kw, idempotency_key="tok")
    assert (again.verified, again.detail["outcome"]) == (True, "already")
    assert again.detail["digest"] == first.detail["digest"]  # the same row read back
    assert rows(orders) == before


def test_restore_refuses_to_overwrite_a_concurrent_writer_and_reports_the_diff(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    kw = committed_update(pg_dsn, tmp_path / "w.wal", {"status": "shipped"})
    orders.execute("UPDATE orders SET status = 'cancelled by support' WHERE n = 1 AND region='eu'")
    with pytest.raises(TargetChanged) as caught:
        pgc.restore(**kw)
    assert caught.value.diff == {"status": {"expected": "shipped", "found": "cancelled by support"}}
    assert rows(orders)[0][3] == "cancelled by support"


def test_in_process_rollback_escalates_a_concurrent_write_and_keeps_it(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    wal = tmp_path / "esc.wal"
    with pytest.raises(CompensationFailed), saga("pg-esc", wal_path=str(wal)):
        pgc.update_row(pg_dsn, "orders", KEY, {"qty": 10})
        orders.execute("UPDATE orders SET qty = 11 WHERE n = 1 AND region = 'eu'")
        raise Boom
    assert rows(orders)[0][4] == 11
    fold, _ = fold_file(str(wal))
    assert any("concurrent writer" in e.reason for e in fold.escalations())


def test_undo_of_a_delete_does_not_clobber_a_row_that_took_its_key(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    wal = tmp_path / "d.wal"
    key = {"region": "us", "n": 1, "placed": TS}
    with saga("pg-del", wal_path=str(wal)):
        pgc.delete_row(pg_dsn, "orders", key)
    kw = comp_of(wal)
    orders.execute(f"INSERT INTO orders (region, n, placed, status) VALUES ('us', 1, '{TS}', 'x')")
    with pytest.raises(TargetChanged):
        pgc.restore(**kw)
    orders.execute("DELETE FROM orders WHERE region = 'us'")
    assert pgc.restore(**kw).detail["outcome"] == "restored"
    assert pgc.restore(**kw).detail["outcome"] == "already"
    assert orders.execute("SELECT status, meta FROM orders WHERE region = 'us'").fetchall() == [
        ("paid", [])
    ]


def test_resolver_tells_landed_no_effect_and_undecided_from_the_row(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    kw = committed_update(pg_dsn, tmp_path / "res.wal", {"status": "shipped"})
    intent = {k: kw[k] for k in ("database", "schema", "table", "key", "before", "after")}
    landed = pgc.resolve(tool="postgres.update", kwargs=intent)
    assert landed.outcome == "landed"
    assert landed.compensation is not None
    assert landed.compensation.handler == "postgres.restore"
    pgc.restore(**landed.compensation.kwargs)
    assert pgc.resolve(tool="postgres.update", kwargs=intent).outcome == "no_effect"
    orders.execute("UPDATE orders SET status = 'other' WHERE n = 1 AND region = 'eu'")
    assert pgc.resolve(tool="postgres.update", kwargs=intent).outcome == "undecided"
    generated = {**intent, "key": None, "after": {"status": "x"}}
    assert pgc.resolve(tool="postgres.insert", kwargs=generated).outcome == "undecided"


# ---- racing connections ----------------------------------------------------------------


def test_a_write_racing_the_step_on_the_same_row_makes_the_step_a_no_effect(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    """Connection B holds the row locked with an uncommitted change while the step's
    pre-flight read (which sees the committed row) and its guarded write run: the write
    waits for B's lock, finds the row no longer as read, and writes nothing."""
    import psycopg

    wal = tmp_path / "race.wal"
    other = psycopg.connect(pg_dsn)  # a transaction of its own
    other.execute("UPDATE orders SET status = 'B wins' WHERE region = 'eu' AND n = 1")
    outcome: list[BaseException] = []

    def agent() -> None:
        try:
            with saga("pg-race", wal_path=str(wal)):
                pgc.update_row(pg_dsn, "orders", KEY, {"status": "A"})
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=agent)
    t.start()
    deadline = time.monotonic() + 20
    while not orders.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the step never waited for B's row lock"
        time.sleep(0.02)
    other.commit()
    other.close()
    t.join(20)
    assert len(outcome) == 1
    assert isinstance(outcome[0], TargetChanged)
    assert rows(orders)[0][3] == "B wins"
    fold, _ = fold_file(str(wal))
    (view,) = list(fold.sagas())
    (step,) = view.steps.values()
    assert set(step.attempt_states.values()) == {"no_effect"}


# ---- bad input: a typed error, nothing written -----------------------------------------


def test_bad_input_is_refused_before_any_side_effect(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    before = rows(orders)
    wal = tmp_path / "bad.wal"
    upd = functools.partial(pgc.update_row, pg_dsn, "orders")
    now = dt.datetime.now(dt.UTC)
    cases: list[tuple[type[BaseException], str, Any]] = [
        (InvalidTarget, "does not exist", lambda: pgc.update_row(pg_dsn, "no", KEY, {"a": 1})),
        (InvalidTarget, "no column 'colour'", lambda: upd(KEY, {"colour": 1})),
        (InvalidTarget, "no row", lambda: upd({**KEY, "n": 99}, {"status": "x"})),
        (InvalidTarget, "several rows", lambda: upd({"region": "eu"}, {"status": "x"})),
        (InvalidTarget, "integer", lambda: upd(KEY, {"qty": "many"})),
        (InvalidTarget, "already exists", lambda: pgc.insert_row(pg_dsn, "orders", KEY)),
        (SagaUsageError, "datetime", lambda: upd(KEY, {"placed": now})),
        (SecretInKwargs, "Stripe", lambda: upd(KEY, {"note": SECRET})),
        (
            SagaUsageError,
            "set_credential_resolver",
            lambda: pgc.update_row(CredentialRef("db"), "orders", KEY, {"note": "x"}),
        ),
        (SagaUsageError, "CredentialRef", lambda: upd(KEY, {"note": "x"}, password="hunter2")),
    ]
    previous = set_credential_resolver(None)
    try:
        for error, words, call in cases:
            with pytest.raises(error, match=words), saga("bad", wal_path=str(wal)):
                call()
    finally:
        set_credential_resolver(previous)
    assert rows(orders) == before
    fold, _ = fold_file(str(wal)) if wal.exists() else (None, None)
    if fold is not None:
        for view in fold.sagas():
            assert not view.steps or all(
                set(s.attempt_states.values()) <= {"no_effect"} for s in view.steps.values()
            )


def test_hostile_identifiers_are_quoted_never_executed(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidTarget), saga("evil", wal_path=str(tmp_path / "e.wal")):
        pgc.update_row(pg_dsn, 'orders"; DROP TABLE orders; --', KEY, {"status": "x"})
    with pytest.raises(InvalidTarget), saga("evil", wal_path=str(tmp_path / "e.wal")):
        pgc.update_row(pg_dsn, "orders", KEY, {"status\" = 'pwned', \"qty": 1})
    assert rows(orders)[0][3] == "new"


def test_a_credential_ref_for_the_whole_connection_string_keeps_the_host_out_of_the_log(
    orders: Any, pg_dsn: str, tmp_path: Path
) -> None:
    wal = tmp_path / "ref.wal"
    previous = set_credential_resolver({"orders_db": pg_dsn}.__getitem__)
    try:
        with pytest.raises(Boom), saga("ref", wal_path=str(wal)):
            pgc.update_row(CredentialRef("orders_db"), "orders", KEY, {"status": "ref"})
            raise Boom
    finally:
        set_credential_resolver(previous)
    assert rows(orders)[0][3] == "new"
    assert b"127.0.0.1" not in wal.read_bytes()


def test_tools_outside_a_saga_raise_before_connecting(pg_dsn: str) -> None:
    with pytest.raises(NoActiveSaga):
        pgc.update_row(pg_dsn, "orders", KEY, {"status": "x"})


def test_a_missing_psycopg_names_the_postgres_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(MissingExtra) as caught, saga("x", wal_path=str(tmp_path / "m.wal")):
        pgc.update_row("postgresql://nowhere/db", "orders", KEY, {"status": "x"})
    assert "pip install 'sagaops-agent-saga[postgres]'" in str(caught.value)
    assert "pip install '.[postgres]' in a checkout" in str(caught.value)
    assert caught.value.extra == "postgres"
