"""One approval record, the whole story, in the UI (issue 21; ``docs/log-format.md`` §12.3).

Real agents wait on a real ``ApprovalQueue`` in a child process; a real ``agent-saga
ui`` serves the log over HTTP; the real ``agent-saga approvals --json`` is the
reference. Deciding from the UI goes through ``decide_approval``, as the CLI does:
a quorum request stays open after the first approval, the same person deciding twice
is refused (one line, nothing written), an expired request cannot be decided.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal.reader import Record, scan
from agent_saga.wal.tail import data_end
from conftest import TOKEN, UI, Tab, agent_saga, child_env, finish, read_line, screenshot

HERE = Path(__file__).resolve().parent


def _spawn(scenario: str, wal: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "ui_approval_agent.py"), scenario, str(wal)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def quorum_agent(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, dict[str, str]]]:
    """A saga waiting for two people's approval of a wire (its queue in a child process)."""
    wal = tmp_path / "quorum.wal"
    env = child_env(tmp_path)
    agent = _spawn("quorum", wal, env)
    try:
        assert read_line(agent).strip() == "asking"
        yield agent, wal, env
    finally:
        if agent.poll() is None and agent.stdin is not None:
            agent.stdin.write("done\n")
            agent.stdin.flush()
        finish(agent)


def _cli_stories(wal: Path, env: dict[str, str]) -> dict[str, Any]:
    listed = agent_saga("approvals", "--all", "--json", "--wal-path", str(wal), env=env)
    return {a["request"]: a for a in json.loads(listed.stdout)}


def _item(ui: UI) -> dict[str, Any]:
    (item,) = ui.get("/api/v1/approvals?all=1")["items"]
    return dict(item)


def _records(wal: Path, rtype: str) -> list[dict[str, Any]]:
    return [i.data for i in scan(wal) if isinstance(i, Record) and i.data["type"] == rtype]


def _decide(ui: UI, request: str, by: str, **extra: Any) -> tuple[int, Any]:
    body = {"decision": "approve", "note": f"{by} checked the invoice", "by": by, **extra}
    return ui.post(f"/api/v1/approvals/{request}/decide", body)


def test_a_quorum_of_two_is_decided_through_the_ui_by_two_different_people(
    quorum_agent: tuple[subprocess.Popen[str], Path, dict[str, str]],
    ui_factory: Callable[..., UI],
) -> None:
    agent, wal, env = quorum_agent
    ui = ui_factory(wal, token=TOKEN, env=env)
    ui.wait_for(lambda: ui.get("/api/v1/approvals")["items"], what="the request")
    a = _item(ui)
    rid = a["request"]
    assert (a["state"], a["quorum"], a["progress"], a["approvers"]) == (
        "open",
        2,
        "0 of 2 approvals",
        [],
    )
    assert a["story"]["state"] == "open (0 of 2 approved)"

    status, doc = _decide(ui, rid, "alice")
    assert status == 200, doc
    assert doc["decision"] is None  # a quorum of 2: still waiting
    assert (doc["state"], doc["progress"], doc["approvers"]) == (
        "open",
        "1 of 2 approvals",
        ["alice"],
    )
    assert doc["message"].startswith(f"approval 1 of 2 of {rid} ")
    a = _item(ui)
    assert (a["state"], a["progress"]) == ("open", "1 of 2 approvals")
    assert a["story"]["state"] == "open (1 of 2 approved)"
    assert ui.get("/api/v1/approvals")["open"] == 1

    size = data_end(wal)
    status, doc = _decide(ui, rid, "alice")
    assert status == 409, doc
    assert doc["error"].startswith(f"alice already approved request {rid}")
    assert "\n" not in doc["error"]
    assert data_end(wal) == size  # nothing written
    assert _item(ui)["progress"] == "1 of 2 approvals"

    status, doc = _decide(ui, rid, "bob")
    assert status == 200, doc
    assert (doc["decision"], doc["state"], doc["approvers"]) == (
        "approved",
        "approved",
        ["alice", "bob"],
    )
    # What the waiting queue (in the agent's process) got back:
    assert read_line(agent).strip() == "wired, approved by alice+bob"

    # The step that ran under the approval, once the UI read its intent.
    a = ui.wait_for(
        lambda: (x := _item(ui))["story"]["used_by"] and x, what="the intent that used it"
    )
    (used,) = a["story"]["used_by"]
    assert used["step"] == 1
    decisions = a["story"]["decisions"]
    assert [(d["by"], d["decision"], d["counted"], d["break_glass"]) for d in decisions] == [
        ("alice", "approved", True, False),
        ("bob", "approved", True, False),
    ]
    assert a["story"]["state"] == "approved by alice+bob"
    assert a["story"] == _cli_stories(wal, env)[rid]  # the API's story is the CLI's


def test_a_break_glass_approval_from_the_ui_needs_a_note_and_settles_the_quorum_alone(
    quorum_agent: tuple[subprocess.Popen[str], Path, dict[str, str]],
    ui_factory: Callable[..., UI],
) -> None:
    agent, wal, env = quorum_agent
    ui = ui_factory(wal, token=TOKEN, env=env)
    ui.wait_for(lambda: ui.get("/api/v1/approvals")["items"], what="the request")
    rid = _item(ui)["request"]
    size = data_end(wal)
    status, doc = ui.post(
        f"/api/v1/approvals/{rid}/decide",
        {"decision": "approve", "note": " ", "by": "carol", "break_glass": True},
    )
    assert status == 400
    assert "note" in doc["error"]
    status, doc = _decide(ui, rid, "carol", break_glass="yes")
    assert status == 400
    assert "break_glass" in doc["error"]
    assert data_end(wal) == size  # nothing written

    status, doc = _decide(ui, rid, "carol", break_glass=True)
    assert status == 200, doc
    assert (doc["decision"], doc["break_glass"]) == ("approved", True)
    assert doc["message"].endswith("by carol (break-glass)")
    assert read_line(agent).strip() == "wired, approved by carol"
    (record,) = _records(wal, "approval_decided")
    assert (record["break_glass"], record["by"], record["note"]) == (
        True,
        "carol",
        "carol checked the invoice",
    )
    listed = agent_saga("approvals", "--break-glass", "--json", "--wal-path", str(wal), env=env)
    (glass,) = json.loads(listed.stdout)
    assert (glass["request"], glass["by"], glass["counted"]) == (rid, "carol", True)
    a = ui.wait_for(lambda: (x := _item(ui))["story"]["used_by"] and x, what="the intent")
    assert a["break_glass"] is True
    assert a["story"] == _cli_stories(wal, env)[rid]


def test_an_expired_request_shows_as_expired_and_deciding_it_is_refused(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "expired.wal"
    env = child_env(tmp_path)
    agent = _spawn("expire", wal, env)
    assert finish(agent) == 0  # it asked, then died: nobody recorded the expiry
    (asked,) = _records(wal, "approval_requested")
    assert _records(wal, "approval_decided") == []
    ui = ui_factory(wal, token=TOKEN, env=env)
    a = ui.wait_for(
        lambda: (
            (x := ui.get("/api/v1/approvals?all=1")["items"])
            and x[0]["state"] == "expired"
            and x[0]
        ),
        what="the expiry",
    )
    assert a["request"] == asked["request"]
    assert a["story"]["state"] == "expired"
    assert ui.get("/api/v1/approvals") == {"items": [], "open": 0}  # not waiting any more
    assert a["story"] == _cli_stories(wal, env)[a["request"]]

    status, doc = _decide(ui, a["request"], "alice")
    assert status == 409, doc
    assert doc["error"].startswith(f"approval request {a['request']} expired at ")
    assert "\n" not in doc["error"]
    # Whoever notices first records the expiry (as `agent-saga approvals approve` does).
    (expired,) = _records(wal, "approval_decided")
    assert (expired["decision"], expired["by"]) == ("expired", "alice")
    size = data_end(wal)
    status, doc = _decide(ui, a["request"], "bob")
    assert status == 409, doc
    assert doc["error"] == f"approval request {a['request']} was already expired by alice"
    assert data_end(wal) == size
    a = ui.wait_for(
        lambda: (x := _item(ui))["story"]["decisions"] and x, what="the recorded expiry"
    )
    assert (a["state"], a["decision"]) == ("expired", "expired")
    assert [(d["decision"], d["by"], d["counted"]) for d in a["story"]["decisions"]] == [
        ("expired", "alice", True)
    ]
    assert a["story"] == _cli_stories(wal, env)[a["request"]]


# ---- the page ---------------------------------------------------------------------------


def _wait_text(tab: Tab, selector: str, text: str) -> None:
    tab.page.wait_for_function(
        "([sel, text]) => { const el = document.querySelector(sel);"
        " return el !== null && el.textContent.includes(text); }",
        arg=[selector, text],
    )


@pytest.mark.slow
def test_the_page_shows_the_story_and_decides_a_quorum_like_the_cli(
    tab: Tab,
    quorum_agent: tuple[subprocess.Popen[str], Path, dict[str, str]],
    ui_factory: Callable[..., UI],
    tmp_path: Path,
) -> None:
    agent, wal, env = quorum_agent
    ui = ui_factory(wal, env=env)
    tab.sign_in(ui)
    tab.page.goto(ui.url + "#/approvals")
    item = tab.page.locator(".queue-item[data-request]")
    item.wait_for()
    rid = item.get_attribute("data-request")
    assert "0 of 2 approvals" in item.locator(".apr-progress").inner_text()

    def decide(by: str) -> None:
        # The queue is re-drawn every second: fill until both fields hold what was typed
        # right before the click (a re-draw keeps a draft, but never mid-fill).
        note = f"{by} checked the invoice"
        for _ in range(5):
            item.locator("textarea").fill(note)
            item.locator("input[type=text]").fill(by)
            if (
                item.locator("textarea").input_value() == note
                and item.locator("input[type=text]").input_value() == by
            ):
                break
        item.locator("button[data-action=approve]").click()

    decide("alice")
    _wait_text(tab, "#toast", f"approval 1 of 2 of {rid}")
    _wait_text(tab, ".queue-item .apr-progress", "1 of 2 approvals")
    assert item.get_attribute("data-state") == "open"
    assert "alice checked the invoice" in item.locator(".apr-decisions").inner_text()

    size = data_end(wal)
    decide("alice")
    _wait_text(tab, "#toast.bad", f"alice already approved request {rid}")
    assert data_end(wal) == size  # refused: nothing written
    tab.errors[:] = [e for e in tab.errors if "status of 409" not in e]  # the refusal

    decide("bob")
    _wait_text(tab, "#toast", f"approved {rid}")
    assert read_line(agent).strip() == "wired, approved by alice+bob"
    settled = tab.page.locator(".queue-item[data-state=approved]")
    settled.wait_for()
    _wait_text(tab, ".queue-item[data-state=approved] .apr-used", "step 1")
    rows = settled.locator(".apr-decisions li")
    assert rows.count() == 2
    assert [rows.nth(i).get_attribute("data-counted") for i in range(2)] == ["1", "1"]
    text = settled.inner_text()
    for shown in ("2 of 2 approvals", "alice checked the invoice", "bob checked the invoice"):
        assert shown in text
    story = _cli_stories(wal, env)[str(rid)]
    assert story["state"] == "approved by alice+bob"
    assert story["state"] in text  # the page shows the CLI's state line
    screenshot(tab, "ui-approval-story", tmp_path)
    assert tab.errors == []
