"""Governance in a real headless Chromium: the halt banner on every view, the Limits view.

The halt is written by the real ``agent-saga halt`` while the page is open, and lifted
by ``agent-saga resume``; the limits come from real metered sagas, and the view's
numbers are the API's (which ``test_ui_governance.py`` proves equal to ``agent-saga
limits --json``). Halt reasons, names and meter keys are hostile HTML: they must show
as text and never run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_ui_governance import HOSTILE_BY, HOSTILE_REASON, run_limits_agent
from ui_limits_agent import HOSTILE_CUSTOMER

from conftest import TOKEN, UI, Tab, agent_saga, child_env, screenshot

pytestmark = pytest.mark.slow

VIEWS = ("#/", "#/escalations", "#/approvals", "#/limits")
INJECTED = "#halts img, #halts script, #halts i, #limits img, #limits script"


def _served(tmp_path: Path, ui_factory: Callable[..., UI]) -> tuple[Path, dict[str, str], UI]:
    wal = tmp_path / "governed.wal"
    env = child_env(tmp_path)
    run_limits_agent(wal, env)
    return wal, env, ui_factory(wal, token=TOKEN, env=env)


def _go(tab: Tab, hash_: str, ready: str) -> None:
    tab.page.evaluate("(h) => { location.hash = h; }", hash_)
    tab.page.wait_for_selector(ready)


def _not_run(tab: Tab) -> None:
    assert tab.page.locator(INJECTED).count() == 0
    assert tab.page.evaluate("() => window.__pwned === undefined")


def test_a_halt_shows_a_red_banner_on_every_view_until_resume_lifts_it(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal, env, ui = _served(tmp_path, ui_factory)
    tab.sign_in(ui)
    tab.page.wait_for_selector("#runs li")
    assert tab.page.locator("#halts").is_hidden()

    made = json.loads(
        agent_saga(
            *("halt", "--wal-path", str(wal), "--reason", HOSTILE_REASON, "--as", HOSTILE_BY),
            *("--unwind", "--json"),
            env=env,
        ).stdout
    )
    hid = made["halt"]
    tab.page.wait_for_selector(f"#halts li[data-halt='{hid}']")
    saga_id = ui.get("/api/v1/sagas")["items"][0]["saga"]
    for view in VIEWS:
        _go(tab, view, "#content h1, #content .state")
        banner = tab.page.locator("#halts")
        assert banner.is_visible(), view
        assert banner.evaluate("(el) => getComputedStyle(el).backgroundColor") == "rgb(139, 26, 26)"
        item = tab.page.locator(f"#halts li[data-halt='{hid}']")
        assert item.locator(".halt-scope").text_content() == "everything"
        assert item.locator(".halt-reason").text_content() == HOSTILE_REASON  # as text
        assert item.locator(".halt-by").text_content() == HOSTILE_BY
        since = item.locator(".halt-since").text_content() or ""
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \(\d+ (s|min) ago\)", since)
        assert "--unwind" in (item.locator(".halt-unwind").text_content() or "")
        assert item.locator("code").text_content() == (
            f"agent-saga resume --wal-path {wal} --halt {hid} --reason '...'"
        )
        _not_run(tab)
    _go(tab, f"#/saga/{saga_id}", "#saga-name")
    assert tab.page.locator(f"#halts li[data-halt='{hid}']").is_visible()
    screenshot(tab, "ui-halted", tmp_path)

    agent_saga("resume", "--wal-path", str(wal), "--reason", "checked", env=env)
    tab.page.wait_for_selector("#halts", state="hidden")
    assert tab.page.locator("#halts li").count() == 0
    _go(tab, "#/limits", "#limits")
    assert tab.page.locator("#halts").is_hidden()
    _not_run(tab)
    assert tab.errors == []


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def test_the_limits_view_shows_each_meter_busiest_first_with_its_bar(
    tab: Tab, tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    _wal, _env, ui = _served(tmp_path, ui_factory)
    doc: dict[str, Any] = ui.wait_for(lambda: (d := ui.get("/api/v1/limits"))["meters"] and d)
    tab.sign_in(ui)
    tab.page.wait_for_selector("#runs li")
    tab.page.keyboard.press("4")  # the Limits tab's key
    tab.page.wait_for_selector("#limits tbody tr")
    assert "active" in (tab.page.locator("#tab-limits").get_attribute("class") or "")
    rows = tab.page.locator("#limits tbody tr")
    assert rows.count() == len(doc["meters"])  # every declared limit has a meter here
    for i, m in enumerate(doc["meters"]):  # the API's order: busiest first
        row = rows.nth(i)
        assert row.get_attribute("data-limit") == m["limit"]
        cells = row.locator("td")
        assert cells.nth(0).text_content() == m["limit"]
        assert cells.nth(1).text_content() == m["kind"]
        assert cells.nth(2).text_content() == ("\u2013" if m["key"] is None else m["key"])
        assert cells.nth(3).text_content() == m["window_words"]
        for cls in ("used", "held", "max", "remaining"):
            assert row.locator(f"td.{cls}").text_content() == _num(m[cls]), (i, cls)
        width = row.locator(".meter-fill").evaluate("(el) => el.style.width")
        assert width.endswith("%")
        assert float(width[:-1]) == pytest.approx(m["fill"] * 100, abs=0.05)
    # The hostile customer id is a key like any other: shown as text, never run.
    hostile = [m for m in doc["meters"] if m["key"] == HOSTILE_CUSTOMER]
    assert len(hostile) == 1
    assert tab.page.locator("#limits td.meter-key", has_text="acme").text_content() == (
        HOSTILE_CUSTOMER
    )
    _not_run(tab)
    defs = tab.page.locator("#limit-defs tbody tr")
    assert defs.count() == len(doc["limits"])
    assert "500 sum of amount per 1h sliding" in (defs.nth(1).text_content() or "")
    screenshot(tab, "ui-limits", tmp_path)
    assert tab.errors == []
