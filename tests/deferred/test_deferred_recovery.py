"""A deferred call after a SIGKILL anywhere between the commit and its end: the real
``saga-recoveryd`` runs what is left, exactly once (issue 22)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

HERE = Path(__file__).resolve().parent
DAEMON = str(Path(sys.executable).with_name("saga-recoveryd"))

pytestmark = pytest.mark.slow


def _env(ledger: Path) -> dict[str, str]:
    env = {**os.environ, "MAIL_LEDGER": str(ledger)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.pop("MAIL_DOWN", None)
    return env


def _records(wal: Path) -> list[dict[str, Any]]:
    return [i.data for i in open_store(str(wal)).scan() if isinstance(i, Record)]


def _sent(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    rows = [json.loads(x) for x in ledger.read_text().splitlines()]
    return [r for r in rows if r["sent"]]


def _agent(wal: Path, ledger: Path, point: str, which: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HERE / "deferred_agent.py"), str(wal), point, which],
        env=_env(ledger),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _recover(wal: Path, ledger: Path) -> None:
    """Daemon passes until no deferred step is left (the dead owner's lease expires)."""
    for _ in range(40):
        done = subprocess.run(
            [DAEMON, "--wal-path", str(wal), "--import", "mail_service", "--once"],
            env=_env(ledger),
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode in (0, 1), done.stderr
        if any(r["type"] == "deferred_done" for r in _records(wal)):
            return
        time.sleep(0.25)
    raise AssertionError("saga-recoveryd never finished the deferred step")


@pytest.mark.parametrize(
    "point",
    ["deferred.after_commit", "deferred.after_intent", "deferred.after_call",
     "deferred.before_done"],
)  # fmt: skip
def test_a_killed_committer_s_deferred_mail_is_sent_exactly_once_by_the_daemon(
    tmp_path: Path, point: str
) -> None:
    wal, ledger = tmp_path / "d.wal", tmp_path / "mail.jsonl"
    agent = _agent(wal, ledger, point, "mail")
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    end = next(r for r in _records(wal) if r["type"] == "saga_end")
    assert end["outcome"] == "committed"
    assert end["deferred"] == [1]
    _recover(wal, ledger)
    assert [m["to"] for m in _sent(ledger)] == ["ann@example.com"], "sent exactly once"
    [done] = [r for r in _records(wal) if r["type"] == "deferred_done"]
    assert done["outcome"] == "done"
    assert done["by"].startswith("recoveryd-")
    _recover_again = subprocess.run(
        [DAEMON, "--wal-path", str(wal), "--import", "mail_service", "--once"],
        env=_env(ledger),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert _recover_again.returncode == 0, _recover_again.stderr
    assert len(_sent(ledger)) == 1, "a second pass runs nothing"


def test_a_non_idempotent_deferred_call_whose_outcome_was_lost_is_escalated_not_rerun(
    tmp_path: Path,
) -> None:
    wal, ledger = tmp_path / "s.wal", tmp_path / "mail.jsonl"
    agent = _agent(wal, ledger, "deferred.after_call", "sms")
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    assert len(_sent(ledger)) == 1, "the text went out before the crash"
    _recover(wal, ledger)
    assert len(_sent(ledger)) == 1, "never sent twice on a guess"
    [done] = [r for r in _records(wal) if r["type"] == "deferred_done"]
    assert done["outcome"] == "escalated"
    [esc] = [r for r in _records(wal) if r["type"] == "escalated"]
    assert "may have run" in esc["reason"]


def test_a_deferred_step_whose_tool_the_daemon_cannot_import_is_escalated(
    tmp_path: Path,
) -> None:
    wal, ledger = tmp_path / "u.wal", tmp_path / "mail.jsonl"
    agent = _agent(wal, ledger, "deferred.after_commit", "mail")
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    for _ in range(40):
        subprocess.run(
            [DAEMON, "--wal-path", str(wal), "--once"],  # no --import
            env=_env(ledger),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if any(r["type"] == "deferred_done" for r in _records(wal)):
            break
        time.sleep(0.25)
    assert _sent(ledger) == []
    [esc] = [r for r in _records(wal) if r["type"] == "escalated"]
    assert "not registered in this saga-recoveryd" in esc["reason"]


def test_a_halt_written_after_the_commit_stops_the_daemon_from_sending_it(
    tmp_path: Path,
) -> None:
    """The kill switch reaches deferred calls: the daemon escalates, sends nothing."""
    from agent_saga.wal.halts import halt

    wal, ledger = tmp_path / "h.wal", tmp_path / "mail.jsonl"
    agent = _agent(wal, ledger, "deferred.after_commit", "mail")
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    halt(str(wal), reason="the agent went rogue", by="alice")
    _recover(wal, ledger)
    assert _sent(ledger) == [], "never sent while the log is halted"
    [done] = [r for r in _records(wal) if r["type"] == "deferred_done"]
    assert done["outcome"] == "escalated"
    [esc] = [r for r in _records(wal) if r["type"] == "escalated"]
    assert "the log is halted for everything by alice: the agent went rogue" in esc["reason"]
