"""The page tells the truth, checked in a real headless Chromium at several sizes.

* A committed IRREVERSIBLE step is done and can never be undone: it is never "owed".
  A committed COMPENSABLE step is owed only while its saga may still fail or is
  being undone, never once the saga committed.
* A retried saga (``agent-saga escalations retry``) lists its compensations newest
  first by the order its steps completed (LIFO), whatever order the retries wrote
  them in, and shows each retry as history.
* The records table never runs underneath the inspector; nothing is clipped
  horizontally without a scrollbar (or an ellipsis with the full text in a title).
* Counts are pluralised: "1 step", "2 steps".

Every test runs at 1280x800 and 1920x1080 (the layout test at 1400x900 too). The WAL
is built once per module by real agents, the real ``saga-recoveryd`` and the real
``agent-saga escalations retry``; one server and one browser serve every test.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_ui_browser import _open_run, _wait_text

from conftest import (
    BIN,
    HERE,
    UI,
    Tab,
    agent_saga,
    child_env,
    start_ui,
    stop_ui,
)

pytestmark = pytest.mark.slow

SIZES = {"1280x800": (1280, 800), "1920x1080": (1920, 1080)}
LAYOUT_SIZES = {**SIZES, "1400x900": (1400, 900)}


@dataclass
class Truth:
    """The module's WAL, its server and the saga ids by name."""

    wal: Path
    env: dict[str, str]
    ui: UI
    names: dict[str, str]

    def saga(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.ui.get(f"/api/v1/sagas/{self.names[name]}")
        return doc


def _agent(scenario: str, wal: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HERE / "ui_truth_agent.py"), scenario, str(wal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _recoveryd(wal: Path, env: dict[str, str], *imports: str) -> str:
    cmd = [str(BIN / "saga-recoveryd"), "--wal-path", str(wal), "--once", "--wait=30"]
    cmd += ["--retry-attempts", "2", "--retry-delay", "0"]
    for module in imports:
        cmd += ["--import", module]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _retry(wal: Path, env: dict[str, str], escalation: str, note: str) -> None:
    agent_saga(
        "escalations", "retry", escalation, "--note", note, "--by", "ops",
        "--wal-path", str(wal), env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Truth]:
    """keep, single, long, and a crashed batch whose escalations were retried.

    The batch: three bookings, SIGKILL; a daemon without ``--import`` escalates all
    three (handler not registered). Then an operator retries them one at a time,
    oldest first, each carried out by its own daemon pass: step 1 (undone), step 2
    during the hotel's outage (fails again, escalated again), step 3 (undone), and
    step 2 again once the outage is over (undone). The log therefore holds the
    compensations in the order 1, 2 (failed), 3, 2: not newest first.
    """
    from agent_saga.wal.state import fold_file

    d = tmp_path_factory.mktemp("truth")
    wal = d / "truth.wal"
    outage = d / "outage"
    env = child_env(d, UI_FLAKY=str(outage))
    for scenario in ("keep", "single", "long"):
        done = _agent(scenario, wal, env)
        assert done.returncode == 0, done.stderr
    killed = _agent("batch", wal, env)
    assert killed.returncode == -9, killed.stderr
    out = _recoveryd(wal, env)  # no --import: every handler is missing
    assert out.count('"event": "escalated"') == 3, out
    listed = agent_saga("escalations", "--json", "--wal-path", str(wal), env=env)
    esc = {e["step"]: e["escalation"] for e in json.loads(listed.stdout)}
    _retry(wal, env, esc[1], "handlers deployed")
    _recoveryd(wal, env, "ui_truth_agent")
    outage.write_text("down")
    _retry(wal, env, esc[2], "handlers deployed")
    assert '"event": "escalated"' in _recoveryd(wal, env, "ui_truth_agent")
    _retry(wal, env, esc[3], "handlers deployed")
    _recoveryd(wal, env, "ui_truth_agent")
    outage.unlink()
    _retry(wal, env, esc[2], "the hotel API is back")
    _recoveryd(wal, env, "ui_truth_agent")
    fold, damages = fold_file(wal)
    assert not damages
    names = {(v.name or "")[:20]: v.saga_id for v in fold.sagas()}
    ui = start_ui(wal, d, env=env)
    try:
        yield Truth(wal, env, ui, names)
    finally:
        stop_ui(ui)


@pytest.fixture(params=list(SIZES), ids=list(SIZES))
def sized(request: pytest.FixtureRequest, tab: Tab, truth: Truth) -> Tab:
    """The tab, signed in to the module's server, at one of :data:`SIZES`."""
    w, h = SIZES[request.param]
    tab.page.set_viewport_size({"width": w, "height": h})
    tab.sign_in(truth.ui)
    return tab


def _shot(tab: Tab, name: str, tmp: Path) -> Path:
    """A screenshot for whoever reads a failure (never into docs/img: not for the docs)."""
    size = tab.page.viewport_size or {}
    path = tmp / f"{name}-{size.get('width')}x{size.get('height')}.png"
    tab.page.screenshot(path=str(path))
    return path


def _texts(tab: Tab, selector: str) -> list[str]:
    return [str(t) for t in tab.page.locator(selector).all_inner_texts()]


def _travel_to(tab: Tab, i: int, n: int, label: str) -> None:
    tab.page.fill("#slider", str(i))
    _wait_text(tab, "#travel-label", f"record {i + 1}/{n} · {label}")


# ---- owed ------------------------------------------------------------------------------


def test_a_committed_irreversible_step_is_done_and_never_owed(
    sized: Tab, truth: Truth, tmp_path: Path
) -> None:
    tab = sized
    doc = truth.saga("order-and-notify")
    tab.page.goto(f"{truth.ui.url}#/saga/{doc['saga']}")
    _wait_text(tab, "#saga-name", "order-and-notify")
    n = len(doc["records"])
    _wait_text(tab, "#travel-label", f"record {n}/{n}")

    # Now: the saga committed. Nothing is owed; both effects are done, the e-mail for good.
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — still to undo (0)"
    done = _texts(tab, "#ledger-done li")
    assert len(done) == 2, done
    mail = next(t for t in done if "#2 mail.send" in t)
    assert "cannot be undone" in mail
    book = next(t for t in done if "#1 hotel.book" in t)
    assert "cannot be undone" not in book
    _shot(tab, "truth-irreversible-now", tmp_path)

    # After the e-mail committed, before saga_end: the booking would be undone if the
    # saga failed; the e-mail cannot be, so it is not owed even then.
    mail_commit = next(
        r["i"] for r in doc["records"] if r["type"] == "committed" and r["step"] == 2
    )
    _travel_to(tab, mail_commit, n, "committed · step 2")
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — undone if the saga fails (1)"
    owed = _texts(tab, "#ledger-owed li")
    assert len(owed) == 1, owed
    assert "#1 hotel.book" in owed[0], owed
    mail = next(t for t in _texts(tab, "#ledger-done li") if "#2 mail.send" in t)
    assert "cannot be undone" in mail
    # In the timeline the e-mail is committed, never "orphaned" or owed-coloured.
    row = tab.page.locator("#timeline .tl-row[data-kind=forward][data-step='2']")
    assert row.get_attribute("data-outcome") == "committed"
    assert tab.errors == []


# ---- retried saga ----------------------------------------------------------------------


def test_a_retried_saga_lists_its_compensations_newest_first_with_retries_as_history(
    sized: Tab, truth: Truth, tmp_path: Path
) -> None:
    tab = sized
    doc = truth.saga("retried-batch")
    # What the log holds: compensations oldest first, one retry failed (the fixture).
    logged = [r["step"] for r in doc["records"] if r["type"] == "compensated"]
    assert logged == [1, 3, 2], logged
    assert [r["step"] for r in doc["records"] if r["type"] == "escalation_retry"] == [1, 2, 3, 2]

    tab.page.goto(f"{truth.ui.url}#/saga/{doc['saga']}/step/2")
    _wait_text(tab, "#inspector", "Step #2")
    _wait_text(tab, "#timeline .tl-sep", "compensations (newest first)")
    undo = tab.page.locator("#timeline .tl-row[data-kind=undo]")
    assert [undo.nth(i).get_attribute("data-step") for i in range(undo.count())] == ["3", "2", "1"]
    # Step 2's undo row: one bar per run, the failed retry first, then the one that worked.
    bars = tab.page.locator("#timeline .tl-row[data-kind=undo][data-step='2'] .tl-bar")
    assert [bars.nth(i).get_attribute("data-outcome") for i in range(bars.count())] == [
        "failed",
        "compensated",
    ]
    runs = _texts(tab, "#insp-undo-runs li")
    assert len(runs) == 2, runs
    assert "retry requested by ops" in runs[0], runs
    assert "failed" in runs[0], runs
    assert "the hotel API is back" in runs[1], runs
    assert "compensated" in runs[1], runs
    _shot(tab, "truth-retried", tmp_path)

    # The sidebar: the steps' states now, not as they were at saga_end.
    li = tab.page.locator("#runs li", has_text="retried-batch")
    assert "3 steps (3 compensated)" in li.inner_text()
    assert li.get_attribute("data-status") == "rolled_back"  # every retry undid its step

    # Time travel: at saga_end all three are escalated and still owed; at the end, none.
    n = len(doc["records"])
    end = next(r["i"] for r in doc["records"] if r["type"] == "saga_end")
    _travel_to(tab, end, n, "saga_end")
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — still to undo (3)"
    assert tab.page.inner_text("#ledger-undone h3") == "Undone — compensated (0)"
    first_undo = next(r["i"] for r in doc["records"] if r["type"] == "compensated")
    _travel_to(tab, first_undo, n, "compensated · step 1")
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — still to undo (2)"
    assert tab.page.inner_text("#ledger-undone h3") == "Undone — compensated (1)"
    tab.page.keyboard.press("End")
    _wait_text(tab, "#travel-label", "now")
    assert tab.page.inner_text("#ledger-owed h3") == "Owed — still to undo (0)"
    assert tab.page.inner_text("#ledger-undone h3") == "Undone — compensated (3)"
    assert tab.errors == []


def test_the_api_orders_undo_by_completion_and_recounts_a_retried_saga(truth: Truth) -> None:
    doc = truth.saga("retried-batch")
    assert doc["undo_order"] == [3, 2, 1]
    runs = {s["step"]: s["undo_runs"] for s in doc["steps"]}
    assert [r["outcome"] for r in runs[2]] == ["failed", "compensated"]
    assert [r["retry"]["note"] for r in runs[2]] == ["handlers deployed", "the hotel API is back"]
    assert runs[2][0]["attempts"] == 2
    assert runs[2][0]["escalated"]
    assert all(r["retry"]["by"] == "ops" for n in (1, 2, 3) for r in runs[n])
    # Each run's records, for time travel: in the log, one after the other.
    spans = sorted((r["from_i"], r["to_i"]) for n in (1, 2, 3) for r in runs[n])
    assert all(a <= b < c for (a, b), (c, _) in itertools.pairwise(spans))
    (item,) = [i for i in truth.ui.get("/api/v1/sagas")["items"] if i["saga"] == doc["saga"]]
    assert item["steps"] == {"compensated": 3}
    # It ended escalated; retries then undid every step: rolled back. The rest is history.
    assert (item["outcome"], item["status"]) == ("escalated", "rolled_back")
    events = [(e["event"], e["by"]) for e in doc["history"]]
    assert [ev for ev, _ in events].count("retry_requested") == 4
    assert [ev for ev, _ in events].count("compensated") == 3
    assert ("retry_requested", "ops") in events


# ---- layout ----------------------------------------------------------------------------

#: Every visible element of #main: where it overlaps the inspector without being
#: inside it, or where its content is cut horizontally with neither a scrollbar nor an
#: ellipsis and a title holding the full text.
_LAYOUT_PROBLEMS = """() => {
  const out = [];
  const insp = document.getElementById("inspector");
  if (!insp) return ["no inspector"];
  const ib = insp.getBoundingClientRect();
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (typeof el.className === "string" && el.className ? "." + el.className.replace(/ /g, ".") : "");
  // The part of an element that is visible: cut by every ancestor that clips.
  const visible = (el) => {
    let r = el.getBoundingClientRect();
    let box = { l: r.left, t: r.top, r: r.right, b: r.bottom };
    for (let a = el.parentElement; a; a = a.parentElement) {
      const cs = getComputedStyle(a);
      if (cs.overflowX !== "visible" || cs.overflowY !== "visible") {
        const ar = a.getBoundingClientRect();
        box = { l: Math.max(box.l, ar.left), t: Math.max(box.t, ar.top),
                r: Math.min(box.r, ar.right), b: Math.min(box.b, ar.bottom) };
      }
    }
    return box;
  };
  for (const el of document.querySelectorAll("#main *")) {
    if (el === insp || insp.contains(el) || el.contains(insp)) continue;
    const v = visible(el);
    if (v.r - v.l < 1 || v.b - v.t < 1) continue;
    if (v.l < ib.right - 1 && ib.left < v.r - 1 && v.t < ib.bottom - 1 && ib.top < v.b - 1) {
      out.push(`${name(el)} overlaps the inspector`);
    }
  }
  for (const el of document.querySelectorAll("#main, #main *")) {
    const cs = getComputedStyle(el);
    if (cs.display === "inline" || el.clientWidth === 0) continue;
    if (el.scrollWidth <= el.clientWidth + 1) continue;
    if (cs.overflowX === "auto" || cs.overflowX === "scroll") continue;  // a scrollbar
    if ((cs.overflowX === "hidden" || cs.overflowX === "clip") && cs.textOverflow === "ellipsis"
        && (el.title || "").length > 0) continue;  // cut with "…", the full text in a title
    const sizes = `${el.scrollWidth} > ${el.clientWidth}, overflow-x ${cs.overflowX}`;
    out.push(`${name(el)} is cut horizontally (${sizes})`);
  }
  const page = document.scrollingElement;
  if (page.scrollWidth > window.innerWidth) out.push(`the page is wider than the window`);
  return out;
}"""


@pytest.mark.parametrize("size", list(LAYOUT_SIZES), ids=list(LAYOUT_SIZES))
def test_the_records_table_never_runs_underneath_the_inspector(
    tab: Tab, truth: Truth, size: str, tmp_path: Path
) -> None:
    w, h = LAYOUT_SIZES[size]
    tab.page.set_viewport_size({"width": w, "height": h})
    tab.sign_in(truth.ui)
    for name, step in (("retried-batch", 2), ("long-" + "L" * 15, 1)):
        sid = truth.names[name]
        tab.page.goto(f"{truth.ui.url}#/saga/{sid}/step/{step}")
        _wait_text(tab, "#inspector", f"Step #{step}")
        tab.page.wait_for_selector("#records tr[data-i]")
        problems = tab.page.evaluate(_LAYOUT_PROBLEMS)
        shot = _shot(tab, f"truth-layout-{name[:5]}", tmp_path)
        assert problems == [], (shot, problems[:20])
        table = tab.page.locator("#records").bounding_box()
        inspector = tab.page.locator("#inspector").bounding_box()
        assert table is not None
        assert inspector is not None
        assert table["x"] + table["width"] <= inspector["x"], (table, inspector)
    assert tab.errors == []


# ---- counts ----------------------------------------------------------------------------

_BAD_PLURAL = re.compile(
    r"\b1 (?:\w+ )?(?:steps|sagas|records|runs|escalations|approvals|regions|retries|attempts)\b"
)


def test_one_step_is_one_step_and_every_count_is_pluralised(
    sized: Tab, truth: Truth, tmp_path: Path
) -> None:
    tab = sized
    tab.page.wait_for_selector("#runs li")
    solo = tab.page.locator("#runs li", has_text="solo")
    assert "· 1 step (1 committed) ·" in solo.inner_text()
    batch = tab.page.locator("#runs li", has_text="retried-batch")
    assert "· 3 steps (" in batch.inner_text()
    _open_run(tab, "solo")
    _wait_text(tab, "#ledger-done h3", "(1)")
    body = tab.page.inner_text("body")
    assert not _BAD_PLURAL.findall(body), _BAD_PLURAL.findall(body)
    _shot(tab, "truth-one-step", tmp_path)
    assert tab.errors == []


def test_a_wal_with_one_saga_says_one_saga_one_run(tab: Tab, tmp_path: Path, truth: Truth) -> None:
    wal = tmp_path / "one.wal"
    env = child_env(tmp_path)
    done = _agent("single", wal, env)
    assert done.returncode == 0, done.stderr
    ui = start_ui(wal, tmp_path, env=env)
    try:
        for w, h in SIZES.values():
            tab.page.set_viewport_size({"width": w, "height": h})
            tab.sign_in(ui)
            tab.page.wait_for_selector("#runs li")
            _wait_text(tab, "#walstats", "1 saga ·")
            assert tab.page.inner_text("#runs-state") == "1 run"
            assert "1 step (1 committed)" in tab.page.inner_text("#runs li")
            body = tab.page.inner_text("body")
            assert not _BAD_PLURAL.findall(body), _BAD_PLURAL.findall(body)
    finally:
        stop_ui(ui)
    assert tab.errors == []
