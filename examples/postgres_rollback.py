"""PostgreSQL under a saga: rows restored exactly, and a concurrent writer never clobbered.

    make example-postgres        # starts a throw-away PostgreSQL on 127.0.0.1 for the run
    DATABASE_URL=postgresql://user@host/db python examples/postgres_rollback.py

The script works in a table of its own (``agent_saga_example_orders``, dropped first)
in the database ``DATABASE_URL`` names (no password in it: libpq's ``PGPASSWORD`` or
``.pgpass`` supply one, or pass ``database=CredentialRef(...)``).
"""

from __future__ import annotations

import os
import tempfile

import psycopg

from agent_saga import CompensationFailed, saga
from agent_saga.connectors.postgres import delete_row, insert_row, update_row
from agent_saga.wal.state import fold_file

TABLE = "agent_saga_example_orders"


def show(conn: psycopg.Connection, label: str) -> None:
    rows = conn.execute(
        f"SELECT region, n, status, tags, meta FROM {TABLE} ORDER BY region, n"
    ).fetchall()
    print(f"{label}:")
    for row in rows:
        print("   ", row)


def main() -> int:
    dsn = os.environ.get("DATABASE_URL") or os.environ.get("AGENT_SAGA_TEST_PG")
    if not dsn:
        print("set DATABASE_URL (or run `make example-postgres`)")
        return 2
    wal = os.path.join(tempfile.mkdtemp(prefix="pg-example-"), "pg-example.wal")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (region text, n int, "
            "status text, tags text[], meta jsonb, PRIMARY KEY (region, n)); "
            f"INSERT INTO {TABLE} VALUES ('eu', 1, 'new', '{{gift}}', '{{\"lines\": 2}}'), "
            "('us', 7, 'paid', NULL, NULL)"
        )
        show(conn, "before the saga")
        try:
            with saga("fulfil", wal_path=wal):
                update_row(dsn, TABLE, {"region": "eu", "n": 1}, {"status": "shipped", "tags": []})
                insert_row(dsn, TABLE, {"region": "eu", "n": 2, "status": "new"})
                delete_row(dsn, TABLE, {"region": "us", "n": 7})
                show(conn, "inside the saga")
                raise RuntimeError("the model hallucinated a warehouse")
        except RuntimeError as exc:
            print(f"rolled back: {exc}")
        show(conn, "after the rollback (exactly as before)")

        try:
            with saga("racing", wal_path=wal):
                update_row(dsn, TABLE, {"region": "eu", "n": 1}, {"status": "packed"})
                conn.execute(f"UPDATE {TABLE} SET status = 'cancelled by support' WHERE n = 1")
                print("meanwhile support cancelled eu/1 from another connection")
                raise RuntimeError("the agent failed")
        except CompensationFailed as exc:
            print(f"not restored: {exc}")
        fold, _ = fold_file(wal)
        for escalation in fold.open_escalations():
            print(f"escalated: {escalation.reason}")
        show(conn, "the concurrent write is kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
