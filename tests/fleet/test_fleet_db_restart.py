"""``pg_ctl restart`` in the middle of a run: nothing acknowledged is lost, nothing undone twice.

The test runs its own PostgreSQL cluster (restarting the suite's shared one would cut
other tests' connections).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_rig import HERE, Fleet, check_ledger, finished

pytestmark = pytest.mark.slow

TESTENV = HERE.parents[1] / "scripts" / "testenv"


@pytest.fixture
def private_pg(service: Any) -> Iterator[tuple[Any, str]]:
    """A PostgreSQL cluster of this test's own, and its URL."""
    service("AGENT_SAGA_TEST_PG")  # the suite has PostgreSQL: the packages are installed
    sys.path.insert(0, str(TESTENV))
    try:
        from postgres import PostgresService  # scripts/testenv/postgres.py
    finally:
        sys.path.remove(str(TESTENV))
    pg = PostgresService()
    work = Path(tempfile.mkdtemp(prefix="fleet-pg-"))
    env = pg.start(work)
    try:
        yield pg, env["AGENT_SAGA_TEST_PG"]
    finally:
        pg.stop()


def test_a_database_restart_mid_run_loses_nothing_acknowledged_and_undoes_nothing_twice(
    private_pg: tuple[Any, str], tmp_path: Path
) -> None:
    import fleet_handlers

    pg, url = private_pg
    fleet_handlers.create(url)
    env = {
        **os.environ,
        "FLEET_LEDGER_DSN": url,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "HOME": str(tmp_path),
    }
    env.pop("AGENT_SAGA_WAL_KEY", None)
    fleet = Fleet(url=url, env=env)
    try:
        assert fleet.cli("db", "migrate").returncode == 0
        agents = [
            fleet.agent(
                f"host-{i}", sagas=40, steps=2, fail_every=5, lease=2.0, pause_after_error=0.5
            )
            for i in range(2)
        ]
        assert agents[0].stdout is not None
        for _ in range(5):  # a few sagas done before the restart
            agents[0].stdout.readline()
        pg.restart()
        acknowledged: list[dict[str, Any]] = []
        for p in agents:
            lines, stderr = finished(p)
            acknowledged += lines
            assert p.returncode == 0, stderr
            assert "Traceback" not in stderr, stderr
        errors = [line for line in acknowledged if "error" in line]
        for line in errors:  # a clear, typed error for the sagas the restart hit
            assert {"WALError", "CompensationFailed", "LeaseLost"} & set(line["error"]), line
            assert "password" not in line["detail"].lower()
        # Anything left open is recovered once its owner's lease expired (--wait).
        fleet.recover("--wait=30", "--claim-seconds", "3")
        counts = check_ledger(fleet, acknowledged)
        # Sagas that met the restart failed with a typed error; the others went on.
        assert counts["committed"] + counts["rolled_back"] + len(errors) >= 40, counts
        assert counts["committed"] >= 20, counts
    finally:
        for p in fleet.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
