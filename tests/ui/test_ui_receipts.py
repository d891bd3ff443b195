"""The debugger shows what each compensation proved, and a saga in doubt (issue 22).

A log with three rolled-back sagas — a compensation read back and verified, one
whose refund is still pending, one that did not read back as undone — served by a
real ``agent-saga ui``: the list and its ``?status=`` filter say ``in_doubt``, each
step's detail carries its verification and receipt, and the page (real Chromium)
shows the badge and "compensated (verified)" / "in doubt: …" in the step inspector.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_saga import ActionSemantics, Compensation, Receipt, saga, tool
from conftest import TOKEN, UI, Tab

pytestmark = pytest.mark.slow


def _run(wal: Path, name: str, answer: Receipt) -> str:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: answer, handler="ui.receipts.undo"),
    )
    def book(seat: str) -> str:
        return seat

    with pytest.raises(Exception), saga(name, wal_path=str(wal)) as s:
        book(seat="12A")
        sid = s.id
        raise LookupError("the model changed its mind")
    return sid


@pytest.fixture
def doubts(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    wal = tmp_path / "receipts.wal"
    ids = {
        "verified": _run(wal, "ok", Receipt.confirmed({"seat": "12A"})),
        "pending": _run(
            wal, "pending", Receipt.awaiting("ui.receipts.follow", {"id": "r-1"}, {"id": "r-1"})
        ),
        "unverified": _run(wal, "bad", Receipt.mismatch("seat 12A is held by another booking")),
    }
    return wal, ids


def test_the_api_lists_in_doubt_sagas_and_each_steps_verification(
    doubts: tuple[Path, dict[str, str]], ui_factory: Callable[..., UI]
) -> None:
    wal, ids = doubts
    ui = ui_factory(wal, token=TOKEN)
    items = {i["saga"]: i for i in ui.get("/api/v1/sagas")["items"]}
    assert items[ids["verified"]]["status"] == "rolled_back"
    assert items[ids["pending"]]["status"] == "in_doubt"
    assert items[ids["unverified"]]["status"] == "in_doubt"
    only = ui.get("/api/v1/sagas?status=in_doubt")["items"]
    assert {i["saga"] for i in only} == {ids["pending"], ids["unverified"]}
    assert "in_doubt" in ui.get("/api/v1/meta")["statuses"]

    def step(which: str) -> Any:
        (s,) = ui.get(f"/api/v1/sagas/{ids[which]}")["steps"]
        return s

    assert (step("verified")["verification"], step("verified")["receipt"]) == (
        "verified",
        {"seat": "12A"},
    )
    assert step("pending")["verification"] == "pending"
    bad = step("unverified")
    assert bad["verification"] == "unverified"
    assert bad["verify_reason"] == "seat 12A is held by another booking"


def test_the_page_shows_the_badge_and_what_each_compensation_proved(
    tab: Tab, doubts: tuple[Path, dict[str, str]], ui_factory: Callable[..., UI]
) -> None:
    wal, ids = doubts
    ui = ui_factory(wal, token=TOKEN)
    tab.sign_in(ui)
    page = tab.page
    badge = page.locator(f"#runs li[data-saga='{ids['pending']}'] .badge")
    badge.wait_for()
    assert badge.inner_text() == "in doubt"
    expected = {
        "verified": "compensated (verified)",
        "pending": "in doubt: accepted, not final yet",
        "unverified": "in doubt: it did not read back as undone — seat 12A is held by "
        "another booking",
    }
    for which, text in expected.items():
        page.goto(f"{ui.url}#/saga/{ids[which]}/step/1")
        shown = page.locator(f"#insp-verification[data-verification='{which}']")
        shown.wait_for()
        assert shown.inner_text() == text
    assert tab.errors == []
