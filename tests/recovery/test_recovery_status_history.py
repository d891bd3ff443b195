"""Status is what is true now; who did what is history (issue 20, item 5).

A saga whose compensation failed for good ends ``escalated``. Once an operator asks
for a retry and a real ``saga-recoveryd --once`` compensates the step, every reader
says ``rolled_back`` — ``runs``, ``runs --json``, ``runs SAGA_ID`` and the UI's API —
and tells the story as history: escalated by the agent, retry requested by the
operator, compensated by the daemon. A saga a person resolved by hand says
``resolved``, never ``rolled_back``: the library did not undo it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_saga.ui import _api
from agent_saga.ui._index import WalIndex

pytestmark = pytest.mark.slow


def _cli(world, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agent-saga")
    done = subprocess.run(
        [str(exe), *args, "--wal-path", world.wal],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


def _escalated_saga(world) -> dict[str, Any]:
    """An agent rolls back; the refund fails three times: escalated for good."""
    world.env["UNDO_FAILS"] = "always"
    try:
        failed = world.agent(items=["a"], fail_after=True)
    finally:
        del world.env["UNDO_FAILS"]
    assert failed.returncode != 0
    assert world.calls() == ["a", "a", "a"]
    assert world.effects() == []
    (esc,) = json.loads(_cli(world, "escalations", "--json").stdout)
    (run,) = json.loads(_cli(world, "runs", "--json").stdout)
    assert (run["outcome"], run["status"]) == ("escalated", "escalated")
    return esc


def _ui(world, saga_id: str) -> tuple[str, dict[str, Any]]:
    index = WalIndex(world.wal)
    index.refresh()
    (item,) = _api.sagas(index, {})["items"]
    return item["status"], _api.saga(index, saga_id)


def test_an_escalated_saga_retried_and_compensated_by_the_daemon_is_rolled_back_with_its_history(
    world,
) -> None:
    esc = _escalated_saga(world)
    asked = _cli(world, "escalations", "retry", esc["escalation"], "--note", "refund API fixed",
                 "--by", "ops")  # fmt: skip
    assert "retry of" in asked.stdout
    fixed = world.recoveryd("--once")
    assert fixed.returncode == 0, fixed.stderr
    assert world.effects() == ["a"], "compensated once, by the daemon"

    (run,) = json.loads(_cli(world, "runs", "--json").stdout)
    saga_id = run["saga"]
    assert (run["outcome"], run["status"], run["logged_status"]) == (
        "escalated",
        "rolled_back",
        "rolled_back",
    )
    assert run["steps"][0]["state"] == "compensated"
    history = [(e["event"], e["by"]) for e in run["history"]]
    daemon = next(by for event, by in history if event == "claimed")
    assert daemon.startswith("recoveryd-")
    owner = run["owner"]
    assert history == [
        ("started", owner),
        ("escalated", owner),
        ("ended", owner),
        ("retry_requested", "ops"),
        ("claimed", daemon),
        ("compensated", daemon),
        ("resolved", daemon),
    ]
    by_event = {e["event"]: e for e in run["history"]}
    assert "refund API fixed" in by_event["retry_requested"]["detail"]
    assert by_event["ended"]["detail"].startswith("escalated")
    assert by_event["compensated"]["detail"] == "step 1"
    assert all(isinstance(e["ts"], float) for e in run["history"])

    table = _cli(world, "runs").stdout.splitlines()
    assert table[1].split()[2] == "rolled_back"

    one = json.loads(_cli(world, "runs", saga_id, "--json").stdout)
    assert one["status"] == "rolled_back"
    assert one["history"] == run["history"]
    (e,) = one["escalations"]
    assert (e["state"], e["resolved_by"], e["retry"]["by"]) == (
        "closed_by_compensation",
        daemon,
        "ops",
    )
    text = _cli(world, "runs", saga_id[:12]).stdout
    assert "status   rolled_back" in text
    assert "retry_requested" in text
    assert "refund API fixed" in text

    status, doc = _ui(world, saga_id)
    assert status == doc["status"] == "rolled_back"
    assert [(h["event"], h["by"]) for h in doc["history"]] == history


def test_an_escalated_saga_a_person_resolved_is_resolved_not_rolled_back(world) -> None:
    esc = _escalated_saga(world)
    _cli(world, "escalations", "resolve", esc["escalation"], "--note", "refunded in the dashboard",
         "--by", "alice")  # fmt: skip

    (run,) = json.loads(_cli(world, "runs", "--json").stdout)
    assert (run["outcome"], run["status"]) == ("escalated", "resolved")
    assert run["steps"][0]["state"] == "escalated", "nothing undid the step"
    last = run["history"][-1]
    assert (last["event"], last["by"]) == ("resolved", "alice")
    assert "refunded in the dashboard" in last["detail"]
    (resolved,) = json.loads(_cli(world, "runs", "--status", "resolved", "--json").stdout)
    assert resolved["saga"] == run["saga"]
    assert json.loads(_cli(world, "runs", "--status", "rolled_back", "--json").stdout) == []

    one = json.loads(_cli(world, "runs", run["saga"], "--json").stdout)
    assert one["escalations"][0]["state"] == "closed_by_person"
    status, doc = _ui(world, run["saga"])
    assert status == doc["status"] == "resolved"
