"""``agent-saga runs SAGA_ID``: one saga in detail, the terminal twin of the UI's saga view.

Its status and history, its steps (state, tool, semantics, attempts, kwargs as
logged, compensation), the gate's decisions and the approvals with who decided, its
escalations and its records (type, offset, time, who) — read in one pass that keeps
only that saga's records. An unknown id is an error that says how to list sagas; a
unique start of an id is enough.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_saga.cli import main
from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.saga_records import read_saga
from agent_saga.wal.store import open_store

SID = "pay-7f3a21"
ESC = "esc-pay-2"
APR = r.approval_id(SID, 2)


def _records() -> list[dict[str, Any]]:
    t1 = r.recovery_token(SID, 1)
    other = [
        {"type": r.SAGA_BEGIN, "saga": "other-1", "name": "noise", "owner": "o2"},
        {"type": r.SAGA_END, "saga": "other-1", "outcome": "committed", "by": "o2"},
    ]
    return [
        {"type": r.SAGA_BEGIN, "saga": SID, "name": "payout", "owner": "agent-1"},
        {"type": r.INTENT, "saga": SID, "step": 1, "attempt": 1, "tool": "stripe.charge",
         "semantics": "compensable", "kwargs": {"amount": 4200, "api_key": "cred://stripe"},
         "idempotency_key": r.idempotency_key(SID, 1), "approved_by": "gate"},
        {"type": r.COMMITTED, "saga": SID, "step": 1, "attempt": 1, "handler": "stripe.refund",
         "kwargs": {"charge": "ch_1"}, "token": t1},
        *other,
        {"type": r.APPROVAL_REQUESTED, "saga": SID, "name": "payout", "step": 2,
         "tool": "bank.wire", "semantics": "irreversible", "kwargs": {"amount": 5000},
         "request": APR, "expires": 4e9, "by": "agent-1"},
        {"type": r.APPROVAL_DECIDED, "request": APR, "saga": SID, "decision": "approved",
         "by": "carol", "note": "matches invoice 1182"},
        {"type": r.GATE, "saga": SID, "step": 2, "tool": "bank.wire", "semantics": "irreversible",
         "decision": "approved", "decided_by": "carol", "reason": "matches invoice 1182"},
        {"type": r.INTENT, "saga": SID, "step": 2, "attempt": 1, "tool": "bank.wire",
         "semantics": "irreversible", "kwargs": {"amount": 5000},
         "idempotency_key": r.idempotency_key(SID, 2), "approved_by": "carol"},
        {"type": r.FORWARD_FAILED, "saga": SID, "step": 2, "attempt": 1, "outcome": "unknown",
         "error": "timeout"},
        {"type": r.COMPENSATING, "saga": SID, "step": 1, "token": t1, "by": "agent-1"},
        {"type": r.COMPENSATED, "saga": SID, "step": 1, "token": t1, "by": "agent-1"},
        {"type": r.ESCALATED, "saga": SID, "step": 2, "escalation": ESC,
         "reason": "irreversible step of unknown outcome", "by": "agent-1"},
        {"type": r.SAGA_END, "saga": SID, "outcome": "escalated", "by": "agent-1"},
        {"type": r.SAGA_BEGIN, "saga": "pay-7f3a99", "name": "twin", "owner": "o3"},
        {"type": r.ESCALATION_RESOLVED, "escalation": ESC, "note": "wire confirmed by the bank",
         "by": "alice"},
        {"type": r.SAGA_END, "saga": "pay-7f3a99", "outcome": "committed", "by": "o3"},
    ]  # fmt: skip


@pytest.fixture
def wal(tmp_path: Path) -> Path:
    path = tmp_path / "one.wal"
    path.write_bytes(
        b"".join(encode_record({**rec, "ts": 1.7e9 + i}) for i, rec in enumerate(_records()))
    )
    return path


def _json(wal: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["runs", *args, "--wal-path", str(wal), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_saga_id_json_is_one_object_with_status_history_steps_decisions_and_records(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _json(wal, capsys, SID)
    assert isinstance(doc, dict)
    assert (doc["saga"], doc["name"], doc["owner"]) == (SID, "payout", "agent-1")
    assert (doc["outcome"], doc["status"]) == ("escalated", "resolved")  # a person closed it
    assert [(e["event"], e["by"]) for e in doc["history"]] == [
        ("started", "agent-1"),
        ("escalated", "agent-1"),
        ("ended", "agent-1"),
        ("resolved", "alice"),
    ]
    one, two = doc["steps"]
    assert (one["state"], one["tool"], one["semantics"], one["attempts"]) == (
        "compensated",
        "stripe.charge",
        "compensable",
        1,
    )
    assert one["kwargs"] == {"amount": 4200, "api_key": "cred://stripe"}  # as logged
    assert (one["handler"], one["compensation_kwargs"], one["compensated_by"]) == (
        "stripe.refund",
        {"charge": "ch_1"},
        "agent-1",
    )
    assert (two["state"], two["attempt_states"], two["gate_decision"]) == (
        "escalated",
        {"1": "unknown"},
        "approved",
    )
    assert [(d["step"], d["decision"], d["by"], d["reason"]) for d in doc["decisions"]] == [
        (1, "approved", "gate", "passed the automatic checks"),
        (2, "approved", "carol", "matches invoice 1182"),
    ]
    (apr,) = doc["approvals"]
    assert (apr["request"], apr["decision"], apr["decided_by"], apr["note"]) == (
        APR,
        "approved",
        "carol",
        "matches invoice 1182",
    )
    (esc,) = doc["escalations"]
    assert (esc["escalation"], esc["state"]) == (ESC, "closed_by_person")
    assert esc["resolved_by"] == "alice"
    mine = [
        (item.offset, item.data)
        for item in scan(wal)
        if isinstance(item, Record)
        and (item.data.get("saga") == SID or item.data.get("escalation") == ESC)
    ]
    assert [(x["offset"], x["type"]) for x in doc["records"]] == [(o, d["type"]) for o, d in mine]
    by = {x["type"]: x["by"] for x in doc["records"]}
    assert (by["saga_begin"], by["approval_decided"], by["gate"], by["intent"]) == (
        "agent-1",
        "carol",
        "carol",
        None,
    )
    assert all(isinstance(x["ts"], float) for x in doc["records"])


def test_runs_saga_id_json_holds_the_same_entry_runs_json_lists(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = {e["saga"]: e for e in _json(wal, capsys)}[SID]
    doc = _json(wal, capsys, SID)
    for key in set(listed) - {"steps", "escalations"}:
        assert doc[key] == listed[key], key
    assert [s["state"] for s in doc["steps"]] == [s["state"] for s in listed["steps"]]
    assert [e["escalation"] for e in doc["escalations"]] == listed["escalations"]


def test_runs_saga_id_prints_the_saga_as_sections(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", SID, "--wal-path", str(wal)]) == 0
    out = capsys.readouterr().out
    head = dict(line.split(None, 1) for line in out.split("\n\n", 1)[0].splitlines())
    assert (head["saga"], head["status"], head["owner"]) == (SID, "resolved", "agent-1")
    assert "(outcome escalated)" in head["ended"]
    sections = {part.split("\n", 1)[0]: part for part in out.split("\n\n")[1:]}
    assert list(sections) == ["history", "steps", "decisions", "escalations", "records"]
    assert "resolved   alice" in sections["history"]
    assert "wire confirmed by the bank" in sections["history"]
    assert 'stripe.refund {"charge": "ch_1"} by agent-1' in sections["steps"]
    assert "approved (" + APR + ")  carol" in sections["decisions"]
    assert "closed_by_person" in sections["escalations"]
    assert "noise" not in out, "no other saga's records"
    assert "twin" not in out


def test_a_unique_start_of_an_id_is_enough(wal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _json(wal, capsys, "pay-7f3a2")["saga"] == SID
    assert _json(wal, capsys, "pay-7f3a9")["saga"] == "pay-7f3a99"


def test_an_ambiguous_start_names_the_ids_it_matches(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "pay-", "--wal-path", str(wal)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "agent-saga: error: 'pay-' starts more than one saga id (pay-7f3a21, pay-7f3a99); "
        "give more of the id\n"
    )


def test_an_unknown_saga_id_is_an_error_that_says_how_to_list_sagas(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "nope", "--wal-path", str(wal)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"agent-saga: error: no saga 'nope' in {wal}; list the sagas with `agent-saga runs`\n"
    )


def test_status_with_a_saga_id_is_a_usage_error(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", SID, "--status", "resolved", "--wal-path", str(wal)]) == 2
    assert "--status filters the list of sagas" in capsys.readouterr().err


def test_reading_one_saga_folds_only_its_records(wal: Path) -> None:
    one = read_saga(open_store(wal), SID)
    assert [v.saga_id for v in one.fold.sagas()] == [SID]
    assert {rec.get("saga", SID) for _, rec in one.records} == {SID}
    assert [e.escalation for e in one.fold.escalations()] == [ESC]


def test_a_damaged_log_still_shows_the_saga_and_exits_1(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(wal, "ab") as f:
        f.write(b"\xa5\x5a\x01")
    assert main(["runs", SID, "--wal-path", str(wal), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["saga"] == SID
    assert "damaged region" in captured.err
