"""Undo after commit from the debugger: the plan API, the undo API, races, the page.

Real ``agent-saga ui`` processes over WALs written by a real agent
(``ui_undo_agent.py``); the compensation handlers are the ledger handlers of
``tests/recovery`` (``CALLS_LEDGER``: one line per invocation), imported by the
server with ``--import ui_undo_agent``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ui_agent import XSS

from agent_saga import undo_saga
from agent_saga.wal.tail import data_end
from conftest import BIN, HERE, TOKEN, UI, Tab, child_env, screenshot

pytestmark = pytest.mark.slow

RECOVERY = HERE.parent / "recovery"
IMPORT = ("--import", "ui_undo_agent")
ITEMS = ["a", "b", XSS]
#: What the credential resolver hands the agent's tool: never in any response.
SECRET_VALUE = "sk_live_" + "4hTq9Wm2Lp7Xc3Vb8Nz1Ry5K"


class Run:
    """One committed saga of ``ui_undo_agent.py`` and the environment of its processes."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.wal = tmp / "undo.wal"
        env = child_env(tmp, UNDO_SECRET=SECRET_VALUE)
        env["PYTHONPATH"] = os.pathsep.join([str(RECOVERY), env["PYTHONPATH"]])
        for name in ("FORWARD_LEDGER", "CALLS_LEDGER", "EFFECTS_LEDGER", "UNDO_FAIL_STATE"):
            env[name] = str(tmp / f"{name.lower()}.jsonl")
        self.env = env
        done = subprocess.run(
            [sys.executable, str(HERE / "ui_undo_agent.py"), str(self.wal), *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        self.saga = str(json.loads(done.stdout.splitlines()[0])["saga"])

    def ledger(self, name: str) -> list[dict[str, Any]]:
        path = Path(self.env[name])
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def calls(self) -> Counter[str]:
        return Counter(e["item"] for e in self.ledger("CALLS_LEDGER"))

    def dry_run(self, from_step: int | None = None) -> Any:
        return undo_saga(
            self.saga, wal_path=str(self.wal), reason="r", by="t", dry_run=True, from_step=from_step
        )

    def cli_undo(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(BIN / "agent-saga"), "undo", self.saga, "--wal-path", str(self.wal), *IMPORT,
             "--as", "bob", "--reason", "the CLI undoes it too", "--json", *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip


def _plan(ui: UI, run: Run, query: str = "") -> tuple[int, Any]:
    status, _, body = ui.request("GET", f"/api/v1/sagas/{run.saga}/undo-plan{query}")
    return status, json.loads(body)


def _undo(ui: UI, run: Run, plan: str, **fields: Any) -> tuple[int, Any]:
    body = {"reason": "the agent refunded the wrong customer", "plan": plan, **fields}
    return ui.post(f"/api/v1/sagas/{run.saga}/undo", body)


def test_the_plan_api_returns_exactly_the_dry_run_plan_with_credentials_as_references(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path, "--mail")
    ui = ui_factory(run.wal, token=TOKEN, env=run.env, extra=IMPORT)
    for from_step, query in ((None, ""), (2, "?from_step=2")):
        status, doc = _plan(ui, run, query)
        assert status == 200, doc
        want = run.dry_run(from_step)
        assert doc["plan"] == want.digest
        assert doc["undo"] == want.undo
        assert doc["from_step"] == from_step
        assert doc["steps"] == [s.as_json() for s in want.steps]
    status, doc = _plan(ui, run)
    assert [s["step"] for s in doc["steps"]] == [4, 3, 2, 1]  # newest first
    mail = doc["steps"][1]
    assert (mail["tool"], mail["action"]) == ("mail.send", "cannot_undo")
    assert "IRREVERSIBLE" in mail["why"]
    assert doc["steps"][2]["kwargs"] == {"item": "b", "card": {"$credential_ref": "corporate_card"}}
    assert (doc["will_compensate"], doc["cannot_undo"]) == (3, 1)
    _, _, raw = ui.request("GET", f"/api/v1/sagas/{run.saga}/undo-plan")
    assert SECRET_VALUE[:12].encode() not in raw
    assert b"<script>" not in raw  # the hostile item is JSON text (\u003c...)
    assert run.calls() == Counter()  # a plan calls nothing


def test_plan_errors_are_one_line_404_400_409(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path / "c")
    failed = Run(tmp_path / "f", "--fail")
    ui = ui_factory(run.wal, env=run.env)
    cases = [
        (f"/api/v1/sagas/{'0' * 32}/undo-plan", 404, "no such saga"),
        (f"/api/v1/sagas/{run.saga}/undo-plan?from_step=9", 400, "out of range"),
        (f"/api/v1/sagas/{run.saga}/undo-plan?from_step=x", 400, "from_step"),
    ]
    for path, status, text in cases:
        got, _, body = ui.request("GET", path)
        doc = json.loads(body)
        assert (got, doc["status"]) == (status, status), (path, doc)
        assert text in doc["error"]
        assert "\n" not in doc["error"]
        assert "Traceback" not in doc["error"]
    other = ui_factory(failed.wal, env=failed.env)
    got, doc = _plan(other, failed)
    assert got == 409
    assert "did not commit" in doc["error"]


def test_a_post_without_token_origin_or_csrf_or_with_a_stale_plan_changes_nothing(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path)
    ui = ui_factory(run.wal, token=TOKEN, env=run.env, extra=IMPORT)
    _, plan = _plan(ui, run)
    path = f"/api/v1/sagas/{run.saga}/undo"
    body = json.dumps({"reason": "csrf attempt", "plan": plan["plan"]}).encode()
    size = data_end(run.wal)
    good = {
        "Content-Type": "application/json",
        "Origin": f"http://127.0.0.1:{ui.port}",
        "X-CSRF-Token": ui.get("/api/v1/meta")["csrf"],
    }
    attempts = {
        "no token": (good, False),
        "foreign origin": ({**good, "Origin": "http://evil.example"}, True),
        "no origin": ({k: v for k, v in good.items() if k != "Origin"}, True),
        "no csrf header": ({k: v for k, v in good.items() if k != "X-CSRF-Token"}, True),
        "wrong csrf header": ({**good, "X-CSRF-Token": "0" * 64}, True),
        "form content type": ({**good, "Content-Type": "text/plain"}, True),
    }
    for why, (headers, with_token) in attempts.items():
        status, _, _ = ui.request("POST", path, body=body, headers=headers, auth=with_token)
        assert status in (401, 403, 415), why
    for doc, status, text in (
        ({"plan": plan["plan"]}, 400, "reason is required"),
        ({"reason": "r"}, 400, "'plan' must be"),
        ({"reason": "r", "plan": plan["plan"], "from_step": True}, 400, "from_step"),
        ({"reason": f"key {SECRET_VALUE}", "plan": plan["plan"]}, 400, "credential"),
    ):
        got, reply = ui.post(path, doc)
        assert (got, text in reply["error"]) == (status, True), reply
        assert SECRET_VALUE not in json.dumps(reply)
    # The plan shown was for steps 2.. (another page, or the plan changed meanwhile).
    _, partial = _plan(ui, run, "?from_step=2")
    status, reply = _undo(ui, run, partial["plan"])
    assert status == 409
    assert "plan changed" in reply["error"]
    assert reply["plan"]["plan"] == plan["plan"]  # the new plan, to review
    assert reply["plan"]["steps"] == plan["steps"]
    assert data_end(run.wal) == size
    assert run.calls() == Counter()
    assert ui.get(f"/api/v1/sagas/{run.saga}")["status"] == "committed"


def test_an_undo_through_the_api_compensates_each_step_once_and_the_saga_is_undone(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path)
    ui = ui_factory(run.wal, token=TOKEN, env=run.env, extra=IMPORT)
    _, plan = _plan(ui, run)
    status, done = _undo(ui, run, plan["plan"], by="carol")
    assert status == 200, done
    assert done["outcome"] == "undone"
    assert done["results"] == {"3": "compensated", "2": "compensated", "1": "compensated"}
    assert done["plan"] == plan["plan"]
    assert done["steps"] == plan["steps"]
    assert (done["by"], done["escalations"]) == ("carol", [])
    assert run.calls() == Counter(ITEMS)  # each compensation ran exactly once
    keys = [e["key"] for e in run.ledger("CALLS_LEDGER")]
    assert keys == [s["token"] for s in plan["steps"]]  # newest first, with the undo tokens
    ui.wait_for(
        lambda: ui.get(f"/api/v1/sagas/{run.saga}")["status"] == "undone", what="undone status"
    )
    history = [e["event"] for e in ui.get(f"/api/v1/sagas/{run.saga}")["history"]]
    assert "undo_requested" in history
    assert "undone" in history
    again, reply = _undo(ui, run, plan["plan"])
    assert again == 409
    assert "already undone" in reply["error"]
    assert "carol" in reply["error"]
    assert run.calls() == Counter(ITEMS)


def test_without_the_handlers_the_undo_escalates_each_step_and_says_why(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path)
    ui = ui_factory(run.wal, env=run.env)  # no --import: nothing is registered
    _, plan = _plan(ui, run)
    status, done = _undo(ui, run, plan["plan"])
    assert status == 200, done
    assert done["outcome"] == "escalated"
    assert set(done["results"].values()) == {"escalated"}
    assert len(done["escalations"]) == 3
    assert all("handler not registered" in e["reason"] for e in done["escalations"])
    assert "escalated" in done["message"]
    assert run.calls() == Counter()  # nothing half-ran


def test_racing_the_page_and_the_cli_runs_each_compensation_once(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path)
    ui = ui_factory(run.wal, token=TOKEN, env=run.env, extra=IMPORT)
    _, plan = _plan(ui, run)
    ui.csrf = ui.get("/api/v1/meta")["csrf"]
    go = threading.Event()
    page: dict[str, Any] = {}

    def post() -> None:
        go.wait(30)
        page["status"], page["doc"] = _undo(ui, run, plan["plan"])

    poster = threading.Thread(target=post)
    poster.start()
    cli = run.cli_undo()
    go.set()
    out, err = cli.communicate(timeout=120)
    poster.join(120)
    assert not poster.is_alive()
    wins = [page["status"] == 200, cli.returncode == 0]
    assert wins.count(True) == 1, (page, cli.returncode, out, err)
    loser = page["doc"]["error"] if cli.returncode == 0 else err
    assert "undone" in loser or "being undone" in loser, loser
    assert run.calls() == Counter(ITEMS)  # one effect per step in total
    assert Counter(e["item"] for e in run.ledger("EFFECTS_LEDGER")) == Counter(ITEMS)
    ui.wait_for(
        lambda: ui.get(f"/api/v1/sagas/{run.saga}")["status"] == "undone", what="undone status"
    )


def test_undo_this_run_from_the_page_shows_the_plan_asks_why_and_shows_the_outcome(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    run = Run(tmp_path, "--mail")
    ui = ui_factory(run.wal, token=TOKEN, env=run.env, extra=IMPORT)
    tab.sign_in(ui)
    tab.page.goto(f"{ui.url}#/saga/{run.saga}")
    tab.page.click("#undo-btn")
    steps = tab.page.locator("#undo-steps li")
    steps.first.wait_for()
    assert steps.count() == 4
    assert [steps.nth(i).get_attribute("data-step") for i in range(4)] == ["4", "3", "2", "1"]
    assert steps.nth(1).get_attribute("data-action") == "cannot_undo"
    assert "cannot be undone: IRREVERSIBLE" in steps.nth(1).inner_text()
    assert "shop.refund" in steps.nth(2).inner_text()
    assert '"$credential_ref": "corporate_card"' in steps.nth(2).inner_text()
    assert f'"item": {json.dumps(XSS)}' in steps.nth(0).inner_text()  # JSON text, not HTML
    plan = ui.get(f"/api/v1/sagas/{run.saga}/undo-plan")
    assert plan["plan"] in tab.page.inner_text("#undo-digest")
    assert tab.page.is_disabled("#undo-go")  # a reason and the confirmation first
    tab.page.fill("#undo-reason", "refunded the wrong customer")
    assert tab.page.is_disabled("#undo-go")
    tab.page.check("#undo-confirm")
    assert tab.page.is_enabled("#undo-go")
    screenshot(tab, "ui-undo-plan", tmp_path)
    tab.page.click("#undo-go")
    outcome = tab.page.locator("#undo-outcome")
    outcome.wait_for()
    assert outcome.get_attribute("data-outcome") == "escalated"  # the e-mail stays sent
    results = tab.page.locator("#undo-results li")
    got = {
        results.nth(i).get_attribute("data-step"): results.nth(i)
        .locator(".result")
        .get_attribute("data-result")
        for i in range(results.count())
    }
    assert got == {"4": "compensated", "3": "escalated", "2": "compensated", "1": "compensated"}
    assert "IRREVERSIBLE" in tab.page.inner_text("#undo")
    screenshot(tab, "ui-undo-outcome", tmp_path)
    assert run.calls() == Counter(ITEMS)
    tab.page.click("#undo-done")
    tab.page.wait_for_selector("#saga-name + .badge.s-escalated")
    assert tab.page.evaluate("window.__xss") is None
    assert tab.page.locator("img").count() == 0
    assert tab.errors == []


def test_an_import_that_fails_stops_the_server_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "agent-saga"), "ui", "--wal-path", str(tmp_path / "x.wal"), "--port", "0",
         "--import", "no_such_handlers_module"],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("agent-saga ui: error: --import no_such_handlers_module")
