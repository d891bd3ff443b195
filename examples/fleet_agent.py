"""One agent host of a fleet: it books seats in PostgreSQL, logging to the shared log.

    export AGENT_SAGA_WAL_PATH=postgresql://agent@db.internal:5432/agents
    agent-saga db migrate
    python examples/fleet_agent.py --sagas 20 --crash

Run it on as many hosts as you like, all with the same ``AGENT_SAGA_WAL_PATH``; run
``saga-recoveryd --import agent_saga.connectors.postgres`` on two or more of them. Each
saga books two seats (rows of ``agent_saga_example_seats`` in the database the log
URL names, or ``--database``); every third one changes its mind and rolls back in
process. With ``--crash`` the last saga kills its own process with SIGKILL after its
first booking: one of the daemons finds the orphan once its lease expired (on the
database's clock) and deletes that row, exactly once, whichever host it runs on.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg

from agent_saga import saga
from agent_saga.connectors.postgres import insert_row

TABLE = "agent_saga_example_seats"


class ChangedItsMind(Exception):
    """The agent's planned second thought: its saga rolls back."""


def _database(wal: str) -> str:
    """The log's database, without agent-saga's own URL parameters."""
    parts = urlsplit(wal)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def main(argv: list[str] | None = None) -> int:
    """Run the agent; returns its exit code."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sagas", type=int, default=10, help="how many sagas to run")
    p.add_argument("--crash", action="store_true", help="SIGKILL this process mid-saga")
    p.add_argument("--database", default=None, help="where the seats table lives")
    args = p.parse_args(argv)
    wal = os.environ.get("AGENT_SAGA_WAL_PATH", "")
    if not wal.startswith(("postgresql://", "postgres://")):
        print("set AGENT_SAGA_WAL_PATH to a postgresql:// URL (see docs/postgres.md)")
        return 2
    database = args.database or _database(wal)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (seat text PRIMARY KEY, host text)")
    host = socket.gethostname()
    done = {"committed": 0, "rolled_back": 0}
    for n in range(args.sagas):
        last = n == args.sagas - 1
        try:
            with saga("book-seats", lease_seconds=5.0):
                insert_row(
                    database, TABLE, {"seat": f"{host}-{uuid.uuid4().hex[:8]}", "host": host}
                )
                if args.crash and last:
                    print(f"{host}: dying mid-saga; a recovery daemon will undo it", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                insert_row(
                    database, TABLE, {"seat": f"{host}-{uuid.uuid4().hex[:8]}", "host": host}
                )
                if n % 3 == 2:
                    raise ChangedItsMind
            done["committed"] += 1
        except ChangedItsMind:
            done["rolled_back"] += 1
    print(f"{host}: {done['committed']} sagas committed, {done['rolled_back']} rolled back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
