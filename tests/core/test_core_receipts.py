"""Compensations that return a Receipt (issue 22): verified, not matching, or pending.

What the engine writes for each, what the fold makes of it (``in_doubt``), how
``saga-recoveryd`` follows a pending one with a registered handler — and that a
receipt is checked like any other input: a bad one is a clear error, a credential in
it never reaches the log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    CompensationFailed,
    CompensationUnverified,
    Receipt,
    SagaUsageError,
    register_handler,
    saga,
    tool,
)
from agent_saga.recovery import RecoveryDaemon
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.state import fold_file

SECRET = "sk_" + "live_" + "aB3dE5gH7jK9mN1pQ2rS4tU6"
#: What the follow handler of the tests answers next (a test sets it).
NEXT: dict[str, Receipt] = {}


@register_handler("test.receipts.follow")
def follow(ticket: str) -> Receipt:
    return NEXT[ticket]


def records(wal: Path, rtype: str) -> list[dict[str, Any]]:
    return [i.data for i in scan(str(wal)) if isinstance(i, Record) and i.data["type"] == rtype]


def run_and_fail(wal: Path, answer: Receipt | None) -> BaseException | None:
    """One step whose compensation answers ``answer``; the saga fails."""

    def undo() -> Receipt | None:
        return answer

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=undo, handler="test.receipts.undo"),
    )
    def book(seat: str) -> str:
        return seat

    try:
        with saga("booking", wal_path=str(wal)):
            book(seat="12A")
            raise LookupError("the model changed its mind")
    except (LookupError, CompensationFailed) as exc:
        return exc
    return None


def status(wal: Path) -> tuple[str, str | None]:
    fold, _ = fold_file(str(wal))
    (view,) = fold.sagas()
    return view.status, view.steps[1].verification


def daemon_pass(wal: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    d = RecoveryDaemon(str(wal), emit=events.append)
    try:
        d.run_once()
    finally:
        d.close()
    return events


def test_a_compensation_without_a_receipt_is_compensated_unchecked(tmp_path: Path) -> None:
    wal = tmp_path / "plain.wal"
    assert isinstance(run_and_fail(wal, None), LookupError)
    (done,) = records(wal, "compensated")
    assert not {"verified", "pending", "receipt"} & set(done)
    assert status(wal) == ("rolled_back", "unchecked")


def test_a_confirmed_receipt_is_recorded_and_the_step_is_verified(tmp_path: Path) -> None:
    wal = tmp_path / "ok.wal"
    run_and_fail(wal, Receipt.confirmed({"seat": "12A", "state": "free"}))
    (done,) = records(wal, "compensated")
    assert (done["verified"], done["receipt"]) == (True, {"seat": "12A", "state": "free"})
    assert status(wal) == ("rolled_back", "verified")


def test_a_mismatch_escalates_raises_compensation_unverified_and_leaves_the_saga_in_doubt(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "bad.wal"
    error = run_and_fail(wal, Receipt.mismatch("seat 12A is held by another booking"))
    assert isinstance(error, CompensationFailed)
    ((_, _, why),) = error.failures
    assert isinstance(why, CompensationUnverified)
    assert why.reason == "seat 12A is held by another booking"
    (esc,) = records(wal, "escalated")
    assert esc["doubt"] is True
    assert status(wal) == ("in_doubt", "unverified")


def test_a_pending_receipt_is_followed_by_the_daemon_until_it_is_final(tmp_path: Path) -> None:
    wal = tmp_path / "pending.wal"
    run_and_fail(wal, Receipt.awaiting("test.receipts.follow", {"ticket": "t-1"}, {"n": 1}))
    assert status(wal) == ("in_doubt", "pending")
    NEXT["t-1"] = Receipt.awaiting("test.receipts.follow", {"ticket": "t-1"})
    events = daemon_pass(wal)
    assert [e["event"] for e in events].count("in_doubt") == 1
    assert status(wal) == ("in_doubt", "pending")
    NEXT["t-1"] = Receipt.confirmed({"n": 2})
    daemon_pass(wal)
    (settled,) = records(wal, "compensation_verified")
    assert (settled["verified"], settled["receipt"], settled["min_reader"]) == (True, {"n": 2}, 3)
    assert status(wal) == ("rolled_back", "verified")
    fold, _ = fold_file(str(wal))
    (view,) = fold.sagas()
    assert view.history[-1].event == "compensation_verified"


def test_a_pending_receipt_whose_follow_handler_is_unknown_is_escalated_once(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "unknown.wal"
    run_and_fail(wal, Receipt.awaiting("test.receipts.nobody", {"ticket": "t-2"}))
    events = daemon_pass(wal)
    (event,) = [e for e in events if e["event"] == "compensation_verified"]
    assert event["outcome"] == "escalated"
    assert "--import" in event["detail"]
    (esc,) = records(wal, "escalated")
    assert esc["doubt"] is True
    assert status(wal) == ("in_doubt", "pending")


def test_a_credential_in_a_receipt_never_reaches_the_log(tmp_path: Path) -> None:
    wal = tmp_path / "secret.wal"
    run_and_fail(
        wal,
        Receipt.awaiting(
            "test.receipts.follow", {"ticket": "t-3", "token": SECRET}, {"note": SECRET}
        ),
    )
    assert SECRET.encode() not in wal.read_bytes()
    (done,) = records(wal, "compensated")
    assert "follow" not in done  # it could not be followed without the credential ...
    assert "follow_kwargs['token']" in done["reason"]
    assert "CredentialRef" in done["reason"]
    (esc,) = records(wal, "escalated")  # ... so a person is asked at once
    assert esc["doubt"] is True
    assert "redacted" in json.dumps(done["receipt"])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Receipt(pending=True), "needs follow="),
        (lambda: Receipt(verified=False), "needs reason="),
        (lambda: Receipt(pending=True, verified=True, follow="x"), "not verified yet"),
        (lambda: Receipt.confirmed({"blob": "x" * 4000}), "keep it under 2048"),
        (lambda: Receipt.confirmed({"when": object()}), "must be JSON"),
        (lambda: Receipt.confirmed({1: "x"}), "string keys"),  # type: ignore[dict-item]
    ],
)
def test_a_malformed_receipt_is_refused_with_what_to_do(make: Any, message: str) -> None:
    with pytest.raises(SagaUsageError, match=message):
        make()


def test_the_verified_undo_example_of_undo_md_runs_as_pasted(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    text = (Path(__file__).resolve().parents[2] / "docs" / "undo.md").read_text("utf-8")
    section = text.split("## Verified undo\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    printed = re.search(r"It prints:\n\n```\n(.*?)```", section, re.S)
    assert code is not None
    assert printed is not None
    (tmp_path / "seats.py").write_text(code.group(1), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "seats.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed.group(1)
