"""Helpers for the tests that run the commands on a ``postgresql://`` log.

A fresh, migrated database per test module (:func:`module_database`), the console
scripts run as a user runs them (:func:`cli`), and direct reads of the log's tables
(:class:`Tables`) so a test can check what is really in the database.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from shell_rig import AGENT_SAGA, user_env

SCHEMA = "agent_saga"


def server_url() -> str:
    """``AGENT_SAGA_TEST_PG``, or skip (fails under ``CI=true``, see tests/conftest.py)."""
    url = os.environ.get("AGENT_SAGA_TEST_PG")
    if not url:
        pytest.skip(
            "AGENT_SAGA_TEST_PG is not set: run `make test`, or `.venv/bin/python "
            "scripts/testenv run --only postgres -- .venv/bin/python -m pytest`"
        )
    return url


@contextmanager
def module_database(prefix: str, *, migrated: bool = True) -> Iterator[str]:
    """Create a database of its own (migrated unless told not to); drop it after."""
    import psycopg

    server = server_url()
    name = f"t_{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.rpartition('/')[0]}/{name}"
    try:
        if migrated:
            from agent_saga.wal.pg import migrate

            migrate(url)
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_log(database: str) -> str:
    """The URL of a new, empty log (its own ``agent_saga_log``) in ``database``."""
    sep = "&" if "?" in database else "?"
    return f"{database}{sep}agent_saga_log=t-{uuid.uuid4().hex[:12]}"


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``agent-saga`` console script to its end."""
    return subprocess.run(
        [AGENT_SAGA, *args],
        env=user_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, nothing on stdout, one ``agent-saga: error:`` line, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("agent-saga: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


class Tables:
    """Direct reads of one log's rows (the test's own autocommit connection)."""

    def __init__(self, log_url: str) -> None:
        import psycopg

        parts = urlsplit(log_url)
        query = parse_qs(parts.query)
        self.log = query.get("agent_saga_log", ["default"])[0]
        self.schema = query.get("agent_saga_schema", [SCHEMA])[0]
        self.conn: Any = psycopg.connect(parts._replace(query="").geturl(), autocommit=True)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def log_id(self) -> Any:
        """The log's id (``None`` before its first writer)."""
        row = self.conn.execute(
            f"SELECT log_id FROM {self.schema}.logs WHERE name = %s", (self.log,)
        ).fetchone()
        return None if row is None else row[0]

    def next_seq(self) -> int:
        """The log's seq allocator."""
        return int(
            self.conn.execute(
                f"SELECT next_seq FROM {self.schema}.logs WHERE name = %s", (self.log,)
            ).fetchone()[0]
        )

    def records(self) -> list[tuple[int, str | None, bytes]]:
        """``(seq, saga, frame)`` of every row, in seq order."""
        rows = self.conn.execute(
            f"SELECT seq, saga, frame FROM {self.schema}.records WHERE log_id = %s ORDER BY seq",
            (self.log_id(),),
        ).fetchall()
        return [(int(s), saga, bytes(f)) for s, saga, f in rows]

    def archive(self) -> list[tuple[int, str | None, bytes]]:
        """``(seq, saga, frame)`` of every archived row, in seq order."""
        rows = self.conn.execute(
            f"SELECT seq, saga, frame FROM {self.schema}.archive WHERE log_id = %s ORDER BY seq",
            (self.log_id(),),
        ).fetchall()
        return [(int(s), saga, bytes(f)) for s, saga, f in rows]

    def damage(self, seq: int, frame: bytes) -> None:
        """Overwrite one row's frame (damage at rest)."""
        self.conn.execute(
            f"UPDATE {self.schema}.records SET frame = %s WHERE log_id = %s AND seq = %s",
            (frame, self.log_id(), seq),
        )
