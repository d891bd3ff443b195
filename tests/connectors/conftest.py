"""Fixtures for the service connectors: a fresh PostgreSQL database per test module,
localstripe in a subprocess, the Salesforce fake in a thread."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _pg_server() -> str:
    url = os.environ.get("AGENT_SAGA_TEST_PG")
    if not url:
        pytest.skip(
            "AGENT_SAGA_TEST_PG is not set: run the suite with `make test` (it starts "
            "PostgreSQL), or `.venv/bin/python scripts/testenv run --only postgres -- "
            ".venv/bin/python -m pytest tests/connectors`"
        )
    return url


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """A database of its own for this test module, dropped afterwards."""
    import psycopg

    server = _pg_server()
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg(pg_dsn: str) -> Iterator[object]:
    """An autocommit connection to the module's database (the test's own view of it)."""
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c
