"""One status vocabulary (issue 20, item 5): the tables of docs/concepts.md are the list.

The fold, ``agent-saga runs`` (its table, ``--json`` and ``--status``), the debugger
UI's index, API and page all use exactly the names of the "Saga states" table; the
step states and the history events are those of their tables too. One log holds a
saga in every state, so each reader is asked about the same sagas and must agree
saga by saga, not only on the list of names.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga.cli import build_parser, main
from agent_saga.ui import _api
from agent_saga.ui._index import STATUSES, WalIndex
from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record
from agent_saga.wal.state import SagaFold
from agent_saga.wal.status import (
    HISTORY_EVENTS,
    LOGGED_STATUSES,
    SAGA_STATES,
    SAGA_STATUSES,
    STEP_STATES,
)

ROOT = Path(__file__).resolve().parents[1]
CONCEPTS = ROOT / "docs" / "concepts.md"
STATIC = ROOT / "src" / "agent_saga" / "ui" / "static"


def table_names(heading: str) -> tuple[str, ...]:
    """The first column of the table under ``### heading`` in docs/concepts.md."""
    text = CONCEPTS.read_text(encoding="utf-8")
    section = text.split(f"\n### {heading}\n", 1)[1].split("\n#", 1)[0]
    return tuple(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))


def js_object_keys(name: str) -> set[str]:
    """The keys of ``const NAME = {...};`` in app.js."""
    js = (STATIC / "app.js").read_text(encoding="utf-8")
    match = re.search(rf"const {name} = \{{(.*?)\}};", js, re.S)
    assert match is not None, name
    return set(re.findall(r"(\w+):", match.group(1)))


# ---- one log with a saga in every state --------------------------------------------


def _lease(wal: Path, owner: str, now: float) -> None:
    leases = Path(f"{wal}.d") / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    lease = {"owner": owner, "pid": 1, "host": "h", "revoked_by": None, "state": "live"}
    lease.update(renewed=now - 1, expires=now + 600)
    (leases / f"{owner}.json").write_text(json.dumps(lease))


def _saga(sid: str, owner: str, *rest: dict[str, Any]) -> list[dict[str, Any]]:
    begin = {"type": r.SAGA_BEGIN, "saga": sid, "name": f"job-{sid}", "owner": owner}
    return [begin, *({"saga": sid, **rec} for rec in rest)]


def _steps(sid: str) -> list[dict[str, Any]]:
    return [
        {"type": r.INTENT, "step": 1, "attempt": 1, "tool": "pay", "semantics": "compensable",
         "kwargs": {"n": 1}, "idempotency_key": r.idempotency_key(sid, 1), "approved_by": "gate"},
        {"type": r.COMMITTED, "step": 1, "attempt": 1, "handler": "refund", "kwargs": {"n": 1},
         "token": r.recovery_token(sid, 1)},
    ]  # fmt: skip


def _end(outcome: str) -> dict[str, Any]:
    return {"type": r.SAGA_END, "outcome": outcome, "by": "o"}


def _escalated(eid: str) -> dict[str, Any]:
    return {"type": r.ESCALATED, "step": 1, "escalation": eid, "reason": "refund failed",
            "by": "o"}  # fmt: skip


def _undo(sid: str, now: float) -> list[dict[str, Any]]:
    """An undo after commit asked, and claimed by its undoer (docs/log-format.md §12.5)."""
    return [
        {"type": r.UNDO_REQUESTED, "undo": "u", "steps": [1], "from_step": None,
         "reason": "wrong customer", "by": "alice", "identity": {"how": "as", "name": "alice"},
         "plan": "0" * 64},
        {"type": r.CLAIM, "by": "w", "fence": 1, "expires": now + 600, "undo": "u",
         "steps": [{"step": 1, "token": r.undo_token(sid, 1, "u")}]},
    ]  # fmt: skip


@pytest.fixture
def every_state(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A log with one saga per state; returns it and the state each saga is in."""
    now = time.time()
    wal = tmp_path / "states.wal"
    undo = {"type": r.COMPENSATING, "step": 1, "token": r.recovery_token("rb", 1), "by": "a2"}
    claim = {"type": r.CLAIM, "by": "recoveryd-x", "fence": 1, "expires": now + 600, "steps": []}
    token = r.recovery_token("rt", 1)
    recs = [
        *_saga("run", "a1", *_steps("run")),
        *_saga("rb", "a2", *_steps("rb"), undo),
        *_saga("rec", "dead", *_steps("rec"), claim),
        *_saga("orph", "gone", *_steps("orph")),
        *_saga("esc", "o", *_steps("esc"), _escalated("e-esc"), _end("escalated")),
        *_saga("res", "o", *_steps("res"), _escalated("e-res"), _end("escalated")),
        {"type": r.ESCALATION_RESOLVED, "escalation": "e-res", "note": "refunded by hand",
         "by": "alice"},
        *_saga("rt", "o", *_steps("rt"), _escalated("e-rt"), _end("escalated"),
               {"type": r.ESCALATION_RETRY, "escalation": "e-rt", "step": 1, "note": "fixed",
                "by": "ops"},
               {"type": r.CLAIM, "by": "recoveryd-y", "fence": 1, "expires": now + 600,
                "retry": "e-rt", "steps": []},
               {"type": r.COMPENSATING, "step": 1, "token": token, "by": "recoveryd-y"},
               {"type": r.COMPENSATED, "step": 1, "token": token, "by": "recoveryd-y"}),
        {"type": r.ESCALATION_RESOLVED, "escalation": "e-rt", "note": "retried",
         "by": "recoveryd-y"},
        *_saga("com", "o", *_steps("com"), _end("committed")),
        # a refund accepted but not final: saga-recoveryd follows it (§12.6)
        *_saga("dbt", "o", *_steps("dbt"),
               {"type": r.COMPENSATING, "step": 1, "token": r.recovery_token("dbt", 1),
                "by": "o"},
               {"type": r.COMPENSATED, "step": 1, "token": r.recovery_token("dbt", 1),
                "by": "o", "pending": True, "receipt": {"refund": "re_1"},
                "follow": {"handler": "stripe.refund_status", "kwargs": {"refund": "re_1"}}},
               _end("rolled_back")),
        *_saga("ung", "o", *_steps("ung"), _end("committed"), *_undo("ung", now)),
        *_saga("udn", "o", *_steps("udn"), _end("committed"), *_undo("udn", now),
               {"type": r.COMPENSATING, "step": 1, "token": r.undo_token("udn", 1, "u"),
                "by": "w"},
               {"type": r.COMPENSATED, "step": 1, "token": r.undo_token("udn", 1, "u"),
                "by": "w"},
               {"type": r.UNDONE, "undo": "u", "outcome": "undone", "by": "w"}),
    ]  # fmt: skip
    with open(wal, "wb") as f:
        for i, rec in enumerate(recs):
            f.write(encode_record({**rec, "ts": now - 100 + i}))
    _lease(wal, "a1", now)
    _lease(wal, "a2", now)
    expected = {
        "run": "running",
        "rb": "rolling_back",
        "rec": "recovering",
        "orph": "orphaned",
        "esc": "escalated",
        "res": "resolved",
        "rt": "rolled_back",
        "com": "committed",
        "dbt": "in_doubt",
        "ung": "undoing",
        "udn": "undone",
    }
    return wal, expected


# ---- the tables ----------------------------------------------------------------------


def test_the_saga_states_table_is_the_vocabulary_in_code_in_the_same_order() -> None:
    assert table_names("Saga states") == SAGA_STATUSES == tuple(SAGA_STATES)
    assert set(LOGGED_STATUSES) == set(SAGA_STATUSES) - {"orphaned"}


def test_the_step_states_table_is_every_step_state_and_every_step_colour() -> None:
    assert table_names("Step states") == tuple(STEP_STATES)
    assert set(_api.OUTCOME_OF_STATE) == set(STEP_STATES)
    assert set(_api.OWED_STATES) <= set(STEP_STATES)


def test_the_history_table_is_every_history_event_and_the_page_names_each() -> None:
    assert table_names("History") == tuple(HISTORY_EVENTS)
    assert js_object_keys("HISTORY") == set(HISTORY_EVENTS)


# ---- every reader uses those names, and agrees saga by saga ---------------------------


def test_the_fold_gives_every_state_the_log_alone_can_show(
    every_state: tuple[Path, dict[str, str]],
) -> None:
    wal, expected = every_state
    from agent_saga.wal.reader import scan

    fold = SagaFold()
    fold.feed(scan(wal))
    got = {v.saga_id: v.status for v in fold.sagas()}
    assert got == {**expected, "orph": "running"}  # orphaned needs the lease and the clock
    assert set(got.values()) == set(LOGGED_STATUSES)


def test_runs_json_and_its_status_filter_use_exactly_the_tables_names(
    every_state: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    wal, expected = every_state
    assert main(["runs", "--wal-path", str(wal), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {e["saga"]: e["status"] for e in doc} == expected
    assert {e["status"] for e in doc} == set(SAGA_STATUSES)
    assert {e["logged_status"] for e in doc} <= set(LOGGED_STATUSES)
    for status in SAGA_STATUSES:
        assert main(["runs", "--wal-path", str(wal), "--json", "--status", status]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [e["saga"] for e in listed] == [s for s, st in expected.items() if st == status]


def test_runs_status_choices_are_the_tables_names() -> None:
    runs = next(
        choice
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, choice in action.choices.items()
        if name == "runs"
    )
    (status,) = [a for a in runs._actions if "--status" in a.option_strings]
    assert tuple(status.choices or ()) == SAGA_STATUSES


def test_the_ui_index_api_and_page_use_the_tables_names_and_agree_with_runs(
    every_state: tuple[Path, dict[str, str]],
) -> None:
    wal, expected = every_state
    index = WalIndex(str(wal))
    index.refresh()
    meta = _api.meta(index, csrf="c", user="u", token_required=False)
    assert tuple(STATUSES) == tuple(meta["statuses"]) == SAGA_STATUSES
    listed = _api.sagas(index, {})
    assert {i["saga"]: i["status"] for i in listed["items"]} == expected
    assert set(listed["counts"]) == set(SAGA_STATUSES)
    for status in SAGA_STATUSES:
        only = _api.sagas(index, {"status": status})["items"]
        assert [i["saga"] for i in only] == [s for s, st in expected.items() if st == status]
    for sid, status in expected.items():
        assert _api.saga(index, sid)["status"] == status
    assert js_object_keys("LABEL") == set(SAGA_STATUSES)
    css = (STATIC / "app.css").read_text(encoding="utf-8")
    assert {s for s in SAGA_STATUSES if f".s-{s} " not in css} == set(), "a badge colour each"
    for old in ("in_flight", "recovered", "failed"):
        assert old not in js_object_keys("LABEL")
