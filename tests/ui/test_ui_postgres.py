"""``agent-saga ui --wal-path postgresql://…``: the same API over a PostgreSQL log.

The log is written by real agent processes (``ui_agent.py``) and a real
``saga-recoveryd``; decisions made through the API are rows in the database that the
CLI (any host) then reads. No browser: the API is what the page uses.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store
from conftest import (
    BIN,
    TOKEN,
    UI,
    agent_saga,
    child_env,
    finish,
    read_line,
    run_agent,
    spawn_agent,
)
from pg_parity import Tables, fresh_log, module_database

pytestmark = pytest.mark.slow

KEY = base64.b64encode(b"u" * 32).decode()


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with module_database("ui") as url:
        yield url


def crash_and_recover(url: str, env: dict[str, str]) -> None:
    """SIGKILL an agent mid-saga, wait for its lease to lapse, run ``saga-recoveryd --once``."""
    store = open_store(url)
    try:
        before = set(store.leases().owners())
        killed = run_agent("crash", url, env=env)
        assert killed.returncode == -9, killed.stderr
        dead = set(store.leases().owners()) - before
        assert dead
        deadline = time.monotonic() + 30
        while any(not store.leases().is_expired(o) for o in dead):
            assert time.monotonic() < deadline, "the killed agent's lease never expired"
            time.sleep(0.05)
    finally:
        store.close()
    done = subprocess.run(
        [str(BIN / "saga-recoveryd"), "--wal-path", url, "--import", "ui_agent", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"event": "finished"' in done.stdout, done.stdout


@pytest.fixture(scope="module")
def pg_world(database: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A PostgreSQL log with committed, rolled back (by the agent and by the daemon) and
    escalated (two ways) sagas."""
    url = fresh_log(database)
    env = child_env(tmp_path_factory.mktemp("pg-world"))
    for scenario in ("commit", "rollback", "escalate", "fail"):
        run_agent(scenario, url, env=env)
    crash_and_recover(url, env)
    return url, env


def _names(ui: UI) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in ui.get("/api/v1/sagas")["items"]}


def test_the_api_serves_runs_written_by_agents_and_the_daemon_on_postgres(
    pg_world: tuple[str, dict[str, str]], ui_factory: Callable[..., UI]
) -> None:
    url, env = pg_world
    ui = ui_factory(url, token=TOKEN, env=env)
    meta = ui.get("/api/v1/meta")
    report = open_store(url).verify()
    assert meta["wal_path"] == url
    assert meta["records"] == report.records
    assert meta["damage_count"] == 0
    assert meta["sagas"] == 5
    status = {name: item["status"] for name, item in _names(ui).items()}
    assert status == {
        "checkout": "committed",
        "trip-planner": "rolled_back",
        "newsletter": "escalated",
        "unrefundable": "escalated",
        "night-batch": "rolled_back",
    }
    d = ui.get(f"/api/v1/sagas/{_names(ui)['night-batch']['saga']}")
    assert d["claims"][0]["by"].startswith("recoveryd-")
    assert [s["state"] for s in d["steps"]] == ["compensated", "compensated"]
    assert d["undo_order"] == [2, 1]
    in_log = [
        item.offset
        for item in open_store(url).scan()
        if isinstance(item, Record) and item.data.get("saga") == d["saga"]
    ]
    assert [r["offset"] for r in d["records"]] == in_log  # offsets are the rows' seqs
    assert ui.request("GET", "/api/v1/meta", auth=False)[0] == 401


def test_an_escalation_resolved_from_the_api_is_a_row_the_cli_reads(
    database: str, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    url = fresh_log(database)
    env = child_env(tmp_path)
    run_agent("escalate", url, env=env)
    ui = ui_factory(url, token=TOKEN, env=env)
    (esc,) = ui.get("/api/v1/escalations")["items"]
    tables = Tables(url)
    rows_before = len(tables.records())
    status, doc = ui.post(
        f"/api/v1/escalations/{esc['escalation']}/resolve", {"note": "told them", "by": "erin"}
    )
    assert status == 200, doc
    assert len(tables.records()) == rows_before + 1  # committed before the answer
    tables.close()
    listed = agent_saga("escalations", "--all", "--json", "--wal-path", url, env=env)
    (e,) = json.loads(listed.stdout)
    assert (e["resolved"], e["resolved_by"], e["note"]) == (True, "erin", "told them")
    ui.wait_for(lambda: ui.get("/api/v1/escalations")["open"] == 0, what="the queue to empty")


def test_an_approval_decided_from_the_api_releases_the_waiting_agent(
    database: str, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    url = fresh_log(database)
    env = child_env(tmp_path)
    agent = spawn_agent("approval", url, env=env)
    try:
        assert read_line(agent).strip() == "asking"
        ui = ui_factory(url, token=TOKEN, env=env)
        (req,) = ui.wait_for(lambda: ui.get("/api/v1/approvals")["items"], what="the request")
        assert (req["tool"], req["state"]) == ("bank.wire", "open")
        status, doc = ui.post(
            f"/api/v1/approvals/{req['request']}/decide",
            {"decision": "approve", "note": "verified", "by": "carol"},
        )
        assert status == 200, doc
        assert read_line(agent).strip() == "wired"
    finally:
        code = finish(agent)
    assert code == 0
    listed = agent_saga("approvals", "--all", "--json", "--wal-path", url, env=env)
    (a,) = json.loads(listed.stdout)
    assert (a["decision"], a["decided_by"]) == ("approved", "carol")
    ui.wait_for(lambda: _names(ui)["payout"]["status"] == "committed", what="the saga to commit")


def _ui_exit(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "agent-saga"), "ui", "--wal-path", url, "--port", "0", "--token", TOKEN],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_an_encrypted_pg_log_is_served_only_with_its_key(
    database: str, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    url = fresh_log(database)
    run_agent("commit", url, env=child_env(tmp_path, AGENT_SAGA_WAL_KEY=KEY))
    for env, why in (
        (child_env(tmp_path), "no key is configured: set AGENT_SAGA_WAL_KEY"),
        (
            child_env(tmp_path, AGENT_SAGA_WAL_KEY=base64.b64encode(b"x" * 32).decode()),
            "encrypted with another key",
        ),
    ):
        refused = _ui_exit(url, env)
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert "serving" not in refused.stdout
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("agent-saga: error: ")
        assert why in line
    ui = ui_factory(url, token=TOKEN, env=child_env(tmp_path, AGENT_SAGA_WAL_KEY=KEY))
    (item,) = ui.get("/api/v1/sagas")["items"]
    assert (item["name"], item["status"]) == ("checkout", "committed")
