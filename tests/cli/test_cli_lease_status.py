"""Right after a crash, the CLI says who holds each saga and when it is orphaned (issue 8, item 8).

Before the fix ``agent-saga runs`` showed a dead agent's saga as plain ``running``
and ``saga-recoveryd --once`` printed a bare ``skipped-live`` for the whole lease
period (30 s by default), which looked like recovery was broken.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import AGENT_SAGA, RECOVERYD, Shop, assert_no_traceback, events, run

from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record


def _lease_file(wal: Path, owner: str, **fields: Any) -> None:
    """A lease file as docs/log-format.md lays it out: <wal>.d/leases/<owner>.json."""
    leases = Path(f"{wal}.d") / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    data = {"owner": owner, "pid": 1, "host": "h", "revoked_by": None, **fields}
    (leases / f"{owner}.json").write_text(json.dumps(data))


@pytest.fixture
def lease_wal(tmp_path: Path) -> Path:
    """Seven live sagas whose owners' leases are in every state the daemon distinguishes."""
    wal = tmp_path / "l.wal"
    now = time.time()
    owners = ["healthy", "silent", "expired", "missing", "released", "claimed", "stale-claim"]
    with open(wal, "wb") as f:
        for i, owner in enumerate(owners):
            f.write(
                encode_record(
                    {
                        "type": r.SAGA_BEGIN,
                        "saga": owner,
                        "name": owner,
                        "owner": owner,
                        "ts": now - 100 + i,
                    }
                )
            )
        for saga_id, expires in (("claimed", now + 50), ("stale-claim", now - 5)):
            f.write(
                encode_record(
                    {
                        "type": r.CLAIM,
                        "saga": saga_id,
                        "by": "recoveryd-x",
                        "fence": 1,
                        "expires": expires,
                        "steps": [],
                        "ts": now - 10,
                    }
                )
            )
    _lease_file(wal, "healthy", renewed=now - 1, expires=now + 29, state="live")
    _lease_file(wal, "silent", renewed=now - 20, expires=now + 10, state="live")
    _lease_file(wal, "expired", renewed=now - 40, expires=now - 10, state="live")
    _lease_file(wal, "released", renewed=now - 5, expires=now - 5, state="released")
    for owner in ("claimed", "stale-claim"):
        _lease_file(
            wal,
            owner,
            renewed=now - 40,
            expires=now - 10,
            state="revoked",
            revoked_by="recoveryd-x",
        )
    return wal


def test_runs_shows_each_owners_lease_state(lease_wal: Path) -> None:
    proc = run(AGENT_SAGA, "runs", "--wal-path", str(lease_wal))
    assert proc.returncode == 0, proc.stderr
    status = {}
    for line in proc.stdout.splitlines()[1:]:
        saga_id, _name, rest = line.split(None, 2)
        status[saga_id] = rest.split("  ")[0]
    assert status["healthy"] == "running"
    match = re.fullmatch(r"running \(owner silent, orphaned in (\d+) s\)", status["silent"])
    assert match is not None, status["silent"]
    assert 1 <= int(match.group(1)) <= 10
    assert status["expired"] == "orphaned"
    assert status["missing"] == "orphaned"
    assert status["released"].startswith("orphaned (owner ended cleanly"), "a lost record"
    assert status["claimed"] == "recovering", "a daemon holds an unexpired claim"
    assert status["stale-claim"] == "orphaned", "the claiming daemon died: nobody holds it"


def test_runs_json_has_the_lease_fields(lease_wal: Path) -> None:
    proc = run(AGENT_SAGA, "runs", "--wal-path", str(lease_wal), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = {s["saga"]: s for s in json.loads(proc.stdout)}
    silent = doc["silent"]
    assert silent["status"] == "running"
    assert silent["owner_silent"] is True
    assert silent["lease_state"] == "live"
    assert 0 < silent["orphaned_in"] <= 10
    assert silent["lease_expires"] == pytest.approx(silent["lease_renewed"] + 30)
    assert doc["healthy"]["owner_silent"] is False
    assert (doc["expired"]["status"], doc["expired"]["lease_state"]) == ("orphaned", "expired")
    assert (doc["missing"]["lease_state"], doc["missing"]["lease_expires"]) == ("missing", None)
    assert doc["released"]["lease_state"] == "released"
    assert doc["claimed"]["orphaned_in"] is None
    assert doc["stale-claim"]["logged_status"] == "recovering"
    assert doc["stale-claim"]["status"] == "orphaned"


def test_runs_status_orphaned_selects_the_sagas_a_daemon_would_take(lease_wal: Path) -> None:
    proc = run(AGENT_SAGA, "runs", "--wal-path", str(lease_wal), "--status", "orphaned", "--json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(s["saga"] for s in json.loads(proc.stdout)) == [
        "expired",
        "missing",
        "released",
        "stale-claim",
    ]


def test_live_agent_is_running_and_the_daemon_says_when_it_would_orphan(shop: Shop) -> None:
    agent, saga_id = shop.live_agent(lease=6.0)
    try:
        listing = shop.cli("runs", "--json")
        assert listing.returncode == 0, listing.stderr
        (entry,) = json.loads(listing.stdout)
        assert (entry["saga"], entry["status"], entry["lease_state"]) == (
            saga_id,
            "running",
            "live",
        )
        assert 0 < entry["orphaned_in"] <= 6

        proc = shop.recoveryd("--import", "shop_handlers", "--once")
        assert proc.returncode == 0, proc.stderr
        assert_no_traceback(proc)
        (skip,) = [e for e in events(proc.stdout) if e["event"] == "skipped-live"]
        assert skip["saga"] == saga_id
        assert skip["lease_expires"] > time.time() - 6
        assert 0 < skip["orphaned_in"] <= 6
        hint = re.search(
            r"saga-recoveryd: 1 saga\(s\) still owned by a live or recently-dead process; "
            r"their leases expire in up to (\d+) s; rerun then, or use --once --wait",
            proc.stderr,
        )
        assert hint is not None, proc.stderr
        assert 1 <= int(hint.group(1)) <= 6
        assert [e["event"] for e in shop.ledger()] == ["charge"], "a live saga is left alone"
    finally:
        agent.communicate("\n", timeout=60)
    assert agent.returncode == 0


def test_runs_shows_orphaned_once_a_killed_agents_lease_expires(shop: Shop) -> None:
    saga_id = shop.killed_agent(lease=1.0)
    deadline = time.monotonic() + 30
    seen = []
    while True:
        listing = shop.cli("runs", "--json")
        assert listing.returncode == 0, listing.stderr
        (entry,) = json.loads(listing.stdout)
        seen.append(entry["status"])
        if entry["status"] == "orphaned" or time.monotonic() > deadline:
            break
        assert entry["status"] == "running"
        time.sleep(0.1)
    assert seen[-1] == "orphaned", seen
    text = shop.cli("runs")
    assert re.search(rf"^{saga_id}\s+shop\s+orphaned\s", text.stdout, re.M), text.stdout


def test_once_wait_recovers_a_just_killed_agent_in_one_run(shop: Shop) -> None:
    saga_id = shop.killed_agent(lease=8.0)
    before = shop.cli("runs", "--json")
    (entry,) = json.loads(before.stdout)
    assert entry["lease_state"] == "live", "the dead agent's lease still runs"
    proc = shop.recoveryd("--import", "shop_handlers", "--once", "--wait", "60")
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    assert "waiting for the leases or claims of 1 saga(s) to expire" in proc.stderr
    names = [e["event"] for e in events(proc.stdout)]
    assert "skipped-live" not in names
    finished = [e for e in events(proc.stdout) if e["event"] == "finished"]
    assert [(e["saga"], e["outcome"]) for e in finished] == [(saga_id, "rolled_back")]
    assert [e["event"] for e in shop.ledger()] == ["charge", "refund"]
    after = json.loads(shop.cli("runs", "--json").stdout)
    assert after[0]["status"] == "rolled_back"


def test_once_wait_takes_over_a_saga_a_stopped_daemon_left_claimed(shop: Shop) -> None:
    # Another daemon claimed the dead agent's saga and was stopped (SIGTERM ends a
    # daemon after the step in progress): the pass waits for that claim to expire.
    from agent_saga.wal import WALWriter

    saga_id = shop.killed_agent(lease=0.5)
    claimer = WALWriter(shop.cwd / "shop.wal")
    claimer.append(
        {
            "type": r.CLAIM,
            "saga": saga_id,
            "by": "recoveryd-stopped",
            "fence": 1,
            "expires": time.time() + 3,
            "steps": [],
            "ts": time.time(),
        }
    )
    claimer.close()
    proc = shop.recoveryd("--import", "shop_handlers", "--once", "--wait", "60")
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    assert "waiting for the leases or claims of 1 saga(s) to expire" in proc.stderr
    finished = [e for e in events(proc.stdout) if e["event"] == "finished"]
    assert [(e["saga"], e["outcome"]) for e in finished] == [(saga_id, "rolled_back")]
    assert [e["event"] for e in shop.ledger()] == ["charge", "refund"]


def test_once_wait_gives_up_at_its_bound_on_a_healthy_owner(shop: Shop) -> None:
    agent, saga_id = shop.live_agent(lease=3.0)
    try:
        proc = shop.recoveryd("--import", "shop_handlers", "--once", "--wait=1.5")
        assert proc.returncode == 0, proc.stderr
        assert "waited 1.5 s; 1 saga(s) still have a live owner" in proc.stderr
        assert [e["saga"] for e in events(proc.stdout) if e["event"] == "skipped-live"] == [saga_id]
        assert [e["event"] for e in shop.ledger()] == ["charge"]
    finally:
        agent.communicate("\n", timeout=60)


def _read_until(stream: Any, needle: str, timeout: float) -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = stream.readline()
            if not line:
                break
            seen += line
    return seen


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_interrupts_the_wait_cleanly(shop: Shop, sig: int, code: int) -> None:
    agent, saga_id = shop.live_agent(lease=30.0)
    try:
        daemon = subprocess.Popen(
            [RECOVERYD, "--wal-path", "shop.wal", "--import", "shop_handlers", "--once", "--wait"],
            cwd=shop.cwd,
            env=shop.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = _read_until(daemon.stderr, "waiting for the leases", timeout=60)
        assert "waiting for the leases or claims of 1 saga(s) to expire (up to" in seen, seen
        assert "at most 120 s" in seen
        daemon.send_signal(sig)
        out, err = daemon.communicate(timeout=30)
        assert daemon.returncode == code
        assert "interrupted before the pass; no saga was touched" in err
        assert "Traceback" not in seen + err
        assert not [e for e in events(out) if e["event"] == "pass_complete"], "no pass was made"
        listing = json.loads(shop.cli("runs", "--json").stdout)
        assert [(s["saga"], s["status"], s["claim"]) for s in listing] == [
            (saga_id, "running", None)
        ]
    finally:
        agent.communicate("\n", timeout=60)
    assert agent.returncode == 0


def test_default_lease_is_documented_in_the_daemons_help() -> None:
    proc = run(RECOVERYD, "--help")
    assert proc.returncode == 0
    assert "30 s by default" in proc.stdout
    assert "--wait [MAX_SECONDS]" in proc.stdout


def test_recoveryd_help_runs_under_python_dash_m() -> None:
    proc = run(sys.executable, "-m", "agent_saga.recovery.cli", "--help")
    assert proc.returncode == 0, proc.stderr
