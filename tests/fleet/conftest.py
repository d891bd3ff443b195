"""Fixtures of the fleet tests (helpers in ``fleet_rig``)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fleet_rig import HERE, Fleet


@pytest.fixture
def fleet(service: Any, tmp_path: Path) -> Iterator[Fleet]:
    """A fresh database holding the log (migrated) and the service's ledger."""
    import fleet_handlers
    import psycopg

    server = str(service("AGENT_SAGA_TEST_PG"))
    name = f"fleet_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server.rpartition("/")
    url = f"{base}/{name}"
    fleet_handlers.create(url)
    env = {
        **os.environ,
        "FLEET_LEDGER_DSN": url,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "HOME": str(tmp_path),
    }
    env.pop("AGENT_SAGA_WAL_KEY", None)
    f = Fleet(url=url, env=env)
    migrated = f.cli("db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    try:
        yield f
    finally:
        for p in f.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
