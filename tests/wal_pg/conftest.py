"""Fixtures for the PostgreSQL log tests: a fresh log per test, child processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def fresh_pg_log(database: str) -> str:
    """A new log's URL in ``database`` (as ``tests/conftest.py``'s helper)."""
    sep = "&" if "?" in database else "?"
    return f"{database}{sep}agent_saga_log=t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_log(pg_log_database: str) -> str:
    """The URL of a new, empty log in the session's migrated database."""
    return fresh_pg_log(pg_log_database)


@pytest.fixture
def admin(pg_log_database: str) -> Any:
    """An autocommit connection of the test's own to the log database."""
    import psycopg

    with psycopg.connect(pg_log_database, autocommit=True) as c:
        yield c


@pytest.fixture
def spawn() -> Iterator[Callable[[dict[str, Any]], subprocess.Popen[str]]]:
    """``spawn(cfg)`` starts ``pg_child.py`` (JSON lines on stdout); all are reaped after."""
    procs: list[subprocess.Popen[str]] = []

    def start(cfg: dict[str, Any]) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, str(HERE / "pg_child.py"), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait(30)
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                f.close()


def read_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The child's next JSON line (fails with its stderr when it died)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child ended: {err[-2000:]}")
    out: dict[str, Any] = json.loads(line)
    return out


def wait_until(cond: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``cond`` until true; fail after ``timeout`` (a hang guard, not a timing)."""
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
