"""The page in a real headless Chromium (Debian's, driven by PyPI playwright).

Screenshots land in ``$AGENT_SAGA_UI_SCREENSHOTS`` when it is set (``docs/img`` for
``docs/ui.md``), in the test's temporary directory otherwise.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_ui_api import _damage
from ui_agent import XSS

from conftest import (
    TOKEN,
    UI,
    Tab,
    World,
    agent_saga,
    child_env,
    finish,
    read_line,
    run_agent,
    screenshot,
    spawn_agent,
    stop_ui,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _count(tab: Tab, selector: str) -> int:
    return int(tab.page.locator(selector).count())


def _wait_text(tab: Tab, selector: str, text: str) -> None:
    tab.page.wait_for_function(
        "([sel, text]) => { const el = document.querySelector(sel);"
        " return el !== null && el.textContent.includes(text); }",
        arg=[selector, text],
    )


def _open_run(tab: Tab, name: str) -> None:
    tab.page.locator("#runs li", has_text=name).first.click()
    _wait_text(tab, "#saga-name", name)


def test_the_page_loads_and_lists_every_run_with_counts_per_status(
    tab: Tab, served_world: UI, world: World, tmp_path: Path
) -> None:
    tab.sign_in(served_world)
    tab.page.wait_for_selector("#runs li")
    assert _count(tab, "#runs li") == len(world.names)
    counts = served_world.get("/api/v1/sagas")["counts"]
    for status, n in counts.items():
        chip = tab.page.locator(f"#filters [data-status={status}] .n")
        assert chip.inner_text() == str(n), status
    assert tab.page.locator("#runs li[data-status=rolled_back]").count() == counts["rolled_back"]
    assert counts["rolled_back"] >= 2  # by the agent (trip-planner), by the daemon (night-batch)
    n_open = served_world.get("/api/v1/escalations")["open"]
    _wait_text(tab, "#n-esc", str(n_open))
    screenshot(tab, "ui-runs", tmp_path)
    assert tab.errors == []


def test_filtering_by_status_and_searching_narrow_the_list(
    tab: Tab, served_world: UI, world: World
) -> None:
    tab.sign_in(served_world)
    tab.page.wait_for_selector("#runs li")
    tab.page.click("#filters [data-status=escalated]")
    tab.page.wait_for_function(
        "() => [...document.querySelectorAll('#runs li')]"
        ".every(li => li.dataset.status === 'escalated')"
    )
    expected = served_world.get("/api/v1/sagas?status=escalated")["matched"]
    assert _count(tab, "#runs li") == expected
    tab.page.click("#filters [data-status=all]")
    tab.page.fill("#search", "night")
    tab.page.wait_for_function("() => document.querySelectorAll('#runs li').length === 1")
    assert "night-batch" in tab.page.locator("#runs li").inner_text()
    assert tab.errors == []


def test_time_travel_with_the_slider_and_the_arrow_keys_replays_the_recovery(
    tab: Tab, served_world: UI, world: World, tmp_path: Path
) -> None:
    tab.sign_in(served_world)
    tab.page.wait_for_selector("#runs li")
    _open_run(tab, "night-batch")
    doc = served_world.get(f"/api/v1/sagas/{world.names['night-batch']}")
    types = [r["type"] for r in doc["records"]]
    n = len(types)
    _wait_text(tab, "#travel-label", f"record {n}/{n}")
    assert "now" in tab.page.inner_text("#travel-label")
    assert tab.page.inner_text("#ledger-undone h3") == "Undone — compensated (2)"

    tab.page.keyboard.press("Home")
    _wait_text(tab, "#travel-label", f"record 1/{n} · saga_begin")
    second_commit = [i for i, t in enumerate(types) if t == "committed"][1]
    for _ in range(second_commit):
        tab.page.keyboard.press("ArrowRight")
    _wait_text(tab, "#travel-label", f"record {second_commit + 1}/{n} · committed · step 2")
    # The agent is still running here: both bookings are undone only if the saga fails.
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — undone if the saga fails (2)"
    assert tab.page.inner_text("#ledger-undone h3") == "Undone — compensated (0)"

    first_undo = types.index("compensated")
    tab.page.fill("#slider", str(first_undo))
    _wait_text(tab, "#travel-label", f"record {first_undo + 1}/{n} · compensated · step 2")
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — still to undo (1)"
    assert tab.page.inner_text("#ledger-undone h3") == "Undone — compensated (1)"
    # The timeline at this point: step 2 undone (LIFO), step 1 not yet.
    undo_rows = tab.page.locator("#timeline .tl-row[data-kind=undo]")
    assert [undo_rows.nth(i).get_attribute("data-step") for i in range(2)] == ["2", "1"]
    assert [undo_rows.nth(i).get_attribute("data-outcome") for i in range(2)] == [
        "compensated",
        "future",
    ]
    row = tab.page.locator(f"#records tr[data-i='{first_undo}']")
    assert "cur" in (row.get_attribute("class") or "")
    screenshot(tab, "ui-time-travel", tmp_path)
    tab.page.keyboard.press("ArrowLeft")
    _wait_text(tab, "#travel-label", f"record {first_undo}/{n}")
    tab.page.keyboard.press("End")
    _wait_text(tab, "#travel-label", "now")
    assert tab.errors == []


def test_the_inspector_shows_the_exact_compensation_and_copies_it_as_json(
    tab: Tab, served_world: UI, world: World, tmp_path: Path
) -> None:
    tab.page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    tab.sign_in(served_world)
    sid = world.names["night-batch"]
    tab.page.goto(f"{served_world.url}#/saga/{sid}/step/2")
    _wait_text(tab, "#inspector", "Step #2")
    assert tab.page.inner_text("#insp-handler") == "hotel.cancel"
    comp = tab.page.inner_text("#insp-compensation")
    doc = served_world.get(f"/api/v1/sagas/{sid}")
    step = next(s for s in doc["steps"] if s["step"] == 2)
    assert step["token"] in comp
    assert '"room": "302"' in comp
    daemon = doc["claims"][0]["by"]
    attempts = tab.page.locator("#insp-undo-attempts li")
    assert attempts.count() == 2
    assert "compensating" in attempts.nth(0).inner_text()
    assert daemon in attempts.nth(1).inner_text()
    assert tab.page.locator("#timeline .tl-row.sel").count() == 2  # forward and undo rows
    screenshot(tab, "ui-inspector", tmp_path)
    tab.page.click("#copy-json")
    _wait_text(tab, "#toast", "copied as JSON")
    copied = json.loads(tab.page.evaluate("navigator.clipboard.readText()"))
    assert copied["step"] == 2
    assert copied["handler"] == "hotel.cancel"
    assert copied["token"] == step["token"]
    tab.page.keyboard.press("[")
    tab.page.wait_for_url(f"**#/saga/{sid}/step/1")
    assert tab.errors == []


def test_a_credential_is_shown_as_its_reference(tab: Tab, served_world: UI, world: World) -> None:
    tab.sign_in(served_world)
    tab.page.goto(f"{served_world.url}#/saga/{world.names['paid-trip']}/step/1")
    _wait_text(tab, "#inspector", "Step #1")
    assert "credential ref: corporate_card" in tab.page.inner_text("#inspector")


def test_resolving_an_escalation_from_the_page_writes_what_the_cli_lists(
    tab: Tab, world_copy: World, ui_factory: Callable[..., UI], tmp_path: Path
) -> None:
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    tab.sign_in(ui)
    tab.page.click("#tab-escalations")
    tab.page.wait_for_selector(".queue-item[data-escalation]")
    esc = next(
        e
        for e in ui.get("/api/v1/escalations")["items"]
        if e["saga"] == world_copy.names["newsletter"]
    )
    item = tab.page.locator(f".queue-item[data-escalation='{esc['escalation']}']")
    screenshot(tab, "ui-escalations", tmp_path)
    item.locator("textarea").fill("emailed every customer an apology")
    item.locator("input").fill("dana")
    item.locator("button[data-action=resolve]").click()
    _wait_text(tab, "#toast", f"Resolved {esc['escalation']}")
    listed = agent_saga(
        "escalations", "--all", "--json", "--wal-path", str(world_copy.wal), env=world_copy.env
    )
    by_id = {e["escalation"]: e for e in json.loads(listed.stdout)}
    assert by_id[esc["escalation"]]["resolved_by"] == "dana"
    assert by_id[esc["escalation"]]["note"] == "emailed every customer an apology"
    tab.page.wait_for_selector(
        f".queue-item[data-escalation='{esc['escalation']}']", state="detached"
    )
    assert tab.errors == []


def test_approving_from_the_page_lets_the_waiting_agent_proceed(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "approve.wal"
    env = child_env(tmp_path)
    agent = spawn_agent("approval", wal, env=env)
    try:
        assert read_line(agent).strip() == "asking"
        ui = ui_factory(wal, env=env)
        tab.sign_in(ui)
        tab.page.goto(ui.url + "#/approvals")
        item = tab.page.locator(".queue-item[data-request]")
        item.wait_for()
        assert "bank.wire" in item.inner_text()
        assert "DE02120300000000202051" in item.inner_text()
        screenshot(tab, "ui-approvals", tmp_path)
        item.locator("textarea").fill("checked the invoice with finance")
        item.locator("button[data-action=approve]").click()
        _wait_text(tab, "#toast", "approved")
        assert read_line(agent).strip() == "wired"
    finally:
        code = finish(agent)
    assert code == 0
    listed = agent_saga("approvals", "--all", "--json", "--wal-path", str(wal), env=env)
    (a,) = json.loads(listed.stdout)
    assert a["decision"] == "approved"
    assert a["decided_by"] == getpass.getuser()  # nobody typed a name: the OS user, as the CLI
    assert a["note"] == "checked the invoice with finance"


def test_the_page_updates_live_while_an_agent_appends(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "live.wal"
    env = child_env(tmp_path)
    ui = ui_factory(wal, env=env)
    tab.sign_in(ui)
    _wait_text(tab, "#content-state", "no sagas yet")
    agent = spawn_agent("live", wal, env=env)
    assert agent.stdin is not None
    try:
        assert read_line(agent).strip() == "ready"
        agent.stdin.write("r1\n")
        agent.stdin.flush()
        assert read_line(agent).strip() == "ready"
        tab.page.locator("#runs li", has_text="live-agent").wait_for()
        _open_run(tab, "live-agent")
        tab.page.wait_for_selector("#saga-name + .badge.s-running")
        assert _count(tab, "#timeline .tl-row[data-kind=forward]") == 1
        for room in ("r2", "r3"):
            agent.stdin.write(room + "\n")
            agent.stdin.flush()
            assert read_line(agent).strip() == "ready"
        tab.page.wait_for_function(
            "() => document.querySelectorAll('#timeline .tl-row[data-kind=forward]').length === 3"
        )
        screenshot(tab, "ui-live", tmp_path)
        agent.stdin.write("stop\n")
        agent.stdin.flush()
        tab.page.wait_for_selector("#saga-name + .badge.s-committed")
    finally:
        code = finish(agent)
    assert code == 0
    assert tab.errors == []


def test_hostile_names_kwargs_and_errors_render_as_text_and_no_script_runs(
    tab: Tab, served_world: UI, world: World
) -> None:
    tab.sign_in(served_world)
    tab.page.wait_for_selector("#runs li")
    sid = next(v for k, v in world.names.items() if k.startswith("saga<img"))
    assert tab.page.locator("#runs li", has_text=f"saga{XSS}").count() == 1
    tab.page.goto(f"{served_world.url}#/saga/{sid}/step/2")
    _wait_text(tab, "#inspector", "Step #2")
    assert tab.page.inner_text("#saga-name") == f"saga{XSS}"
    assert tab.page.inner_text("#insp-tool") == f"tool{XSS}"
    assert XSS in tab.page.inner_text("#insp-error")
    as_json = json.dumps(XSS)[1:-1]  # kwargs are shown as JSON text
    assert f'"note": "{as_json}"' in tab.page.inner_text("#inspector")
    tab.page.keyboard.press("[")
    _wait_text(tab, "#inspector", "Step #1")
    assert f'"room": "{as_json}"' in tab.page.inner_text("#inspector")
    tab.page.goto(served_world.url + "#/escalations")
    tab.page.wait_for_selector(".queue-item")
    assert tab.page.evaluate("window.__xss") is None
    assert tab.page.locator("img").count() == 0
    assert tab.page.evaluate("document.scripts.length") == 1  # only /static/app.js
    assert tab.errors == []


def test_keyboard_navigation_moves_between_runs_tabs_and_help(
    tab: Tab, served_world: UI, world: World
) -> None:
    tab.sign_in(served_world)
    tab.page.wait_for_selector("#runs li")
    tab.page.keyboard.press("j")
    tab.page.wait_for_selector("#runs li.sel")
    first = tab.page.locator("#runs li.sel").get_attribute("data-saga")
    tab.page.keyboard.press("j")
    tab.page.wait_for_function(
        "(first) => { const s = document.querySelector('#runs li.sel');"
        " return s && s.dataset.saga !== first; }",
        arg=first,
    )
    tab.page.keyboard.press("k")
    tab.page.wait_for_function(
        "(first) => document.querySelector('#runs li.sel').dataset.saga === first", arg=first
    )
    assert f"#/saga/{first}" in tab.page.url
    tab.page.keyboard.press("?")
    assert tab.page.is_visible("#help")
    tab.page.keyboard.press("Escape")
    assert not tab.page.is_visible("#help")
    tab.page.keyboard.press("2")
    tab.page.wait_for_url("**#/escalations")
    tab.page.keyboard.press("/")
    assert tab.page.evaluate("document.activeElement.id") == "search"
    assert tab.errors == []


def test_the_error_state_shows_when_the_server_goes_away(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "gone.wal"
    env = child_env(tmp_path)
    run_agent("commit", wal, env=env)
    ui = ui_factory(wal, env=env)
    tab.sign_in(ui)
    tab.page.wait_for_selector("#runs li")
    stop_ui(ui)
    _wait_text(tab, "#banner", "Lost contact with the server")
    assert tab.page.locator("#live.stale").count() == 1


def test_a_damaged_wal_shows_its_damage_and_offsets(
    tab: Tab, world_copy: World, ui_factory: Callable[..., UI], tmp_path: Path
) -> None:
    corrupt_at, _ = _damage(world_copy.wal)
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    tab.sign_in(ui)
    tab.page.wait_for_selector("#damage:not([hidden])")
    assert "2 damaged regions" in tab.page.inner_text("#damage")
    tab.page.click("#damage")
    assert f"offset {corrupt_at}" in tab.page.inner_text("#damages")
    tab.page.wait_for_selector("#runs li")
    assert _count(tab, "#runs li") == len(world_copy.names)
    screenshot(tab, "ui-damage", tmp_path)


def test_the_demo_log_shows_every_run_including_the_one_recovered_after_sigkill(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "demo.wal"
    env = child_env(tmp_path)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--wal-path", str(wal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert f"agent-saga ui --wal-path {wal}" in done.stdout
    ui = ui_factory(wal, env=env)
    tab.sign_in(ui)
    tab.page.wait_for_selector("#runs li")
    names = tab.page.locator("#runs li .name").all_inner_texts()
    assert sorted(names) == ["newsletter", "newsletter", "purchase", "refactor", "upgrade"]
    upgrade = tab.page.locator("#runs li", has_text="upgrade")
    assert upgrade.get_attribute("data-status") == "undone", "act 4: undone after commit"
    refactor = tab.page.locator("#runs li", has_text="refactor")
    assert refactor.get_attribute("data-status") == "rolled_back"
    _open_run(tab, "refactor")
    _wait_text(tab, ".note", "Claimed by the recovery daemon")
    # Who rolled it back is history: the daemon took it over and ended it.
    _wait_text(tab, "#history", "taken over by recoveryd-")
    assert "ended by recoveryd-" in tab.page.inner_text("#history")
    tab.page.locator("#timeline .tl-row[data-kind=undo]").first.click()
    _wait_text(tab, "#insp-handler", "files.")
    screenshot(tab, "ui-demo-recovered", tmp_path)
    assert tab.errors == []
