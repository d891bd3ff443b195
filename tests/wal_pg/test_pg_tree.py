"""The Merkle tree of a PostgreSQL log: the header, then the rows in seq order (§12.7)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_saga.wal import merkle as m
from agent_saga.wal.store import open_store
from agent_saga.wal.tree import tree_of
from pg_parity import Tables


@pytest.fixture
def tables(pg_log: str) -> Iterator[Tables]:
    t = Tables(pg_log)
    yield t
    t.close()


def _payloads(t: Tables) -> list[bytes]:
    header = t.conn.execute(
        f"SELECT header FROM {t.schema}.logs WHERE name = %s", (t.log,)
    ).fetchone()[0]
    return [bytes(header)[12:]] + [frame[12:] for _, _, frame in t.records()]


def test_the_tree_of_a_postgresql_log_is_its_header_then_its_rows(
    pg_log: str, tables: Tables
) -> None:
    store = open_store(pg_log)
    w = store.writer()
    for i in range(12):
        w.append({"type": "saga_begin", "saga": f"s{i}", "name": "n", "owner": w.owner, "ts": 1.0})
    w.close()
    tree = tree_of(store)
    payloads = _payloads(tables)
    assert tree.size == 13
    assert tree.root() == m.mth(payloads)
    assert tree.log == tables.log_id()
    assert all(b'"salt":"' in p for p in payloads[1:])
    assert b'"salt"' not in payloads[0]
