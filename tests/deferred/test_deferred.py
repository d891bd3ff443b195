"""``@tool(defer=True)``: an IRREVERSIBLE call gated and recorded now, run once the saga
commits — exactly once — and never if it rolls back (issue 22). In-process here; the
crashes and the daemon are in test_deferred_recovery.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from mail_service import send_mail

from agent_saga import (
    ActionSemantics,
    AllowList,
    Deferred,
    GateRefused,
    saga,
    tool,
)
from agent_saga.errors import SagaUsageError
from agent_saga.wal.deferred import DeferredFold
from agent_saga.wal.reader import Record
from agent_saga.wal.state import fold_file
from agent_saga.wal.store import open_store

APPROVE = AllowList({"mail.send"})


@pytest.fixture
def mail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ledger = tmp_path / "mail.jsonl"
    monkeypatch.setenv("MAIL_LEDGER", str(ledger))
    monkeypatch.delenv("MAIL_DOWN", raising=False)
    return ledger


def _sent(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    rows = [json.loads(x) for x in ledger.read_text().splitlines()]
    return [r for r in rows if r["sent"]]


def _records(wal: str) -> list[dict[str, Any]]:
    return [i.data for i in open_store(wal).scan() if isinstance(i, Record)]


def test_a_deferred_call_returns_a_placeholder_and_runs_once_after_the_commit(
    tmp_path: Path, mail: Path
) -> None:
    wal = str(tmp_path / "d.wal")
    with saga("order", wal_path=wal, approver=APPROVE) as s:
        placeholder = send_mail(to="ann@example.com", subject="your order")
        assert isinstance(placeholder, Deferred)
        assert placeholder.id == f"{s.id}:1"
        assert "runs once saga" in str(placeholder)
        assert _sent(mail) == [], "nothing is sent while the saga runs"
    assert [m["to"] for m in _sent(mail)] == ["ann@example.com"]
    types = [r["type"] for r in _records(wal)]
    assert types.index("deferred") < types.index("saga_end") < types.index("intent")
    assert types[-3:] == ["intent", "committed", "deferred_done"]
    end = next(r for r in _records(wal) if r["type"] == "saga_end")
    assert end["outcome"] == "committed"
    assert end["deferred"] == [1]
    fold = DeferredFold()
    fold.feed(open_store(wal).scan())
    assert fold.waiting() == [], "nothing left to run"
    sagas, _ = fold_file(wal)
    view = sagas.get(s.id)
    assert view is not None
    assert [h.event for h in view.history].count("deferred") == 1
    assert sagas.anomalies == [], "the run after saga_end is expected, not an anomaly"


def test_a_deferred_call_never_runs_when_the_saga_rolls_back(tmp_path: Path, mail: Path) -> None:
    wal = str(tmp_path / "r.wal")
    with pytest.raises(RuntimeError), saga("order", wal_path=wal, approver=APPROVE):
        send_mail(to="ann@example.com", subject="your order")
        raise RuntimeError("the agent changed its mind")
    assert _sent(mail) == []
    end = next(r for r in _records(wal) if r["type"] == "saga_end")
    assert end["outcome"] == "rolled_back"
    assert "deferred" not in end
    assert not [r for r in _records(wal) if r["type"] == "intent"]


def test_a_deferred_call_of_a_savepoint_that_rolls_back_never_runs(
    tmp_path: Path, mail: Path
) -> None:
    wal = str(tmp_path / "n.wal")
    with saga("order", wal_path=wal, approver=APPROVE):
        send_mail(to="kept@example.com", subject="a")
        with pytest.raises(RuntimeError), saga("inner"):
            send_mail(to="dropped@example.com", subject="b")
            raise RuntimeError("undo the inner part")
    assert [m["to"] for m in _sent(mail)] == ["kept@example.com"]


def test_a_deferred_call_is_gated_now_and_a_refusal_records_nothing_deferred(
    tmp_path: Path, mail: Path
) -> None:
    wal = str(tmp_path / "g.wal")
    with pytest.raises(GateRefused), saga("order", wal_path=wal):  # default: deny all
        send_mail(to="ann@example.com", subject="x")
    assert not [r for r in _records(wal) if r["type"] == "deferred"]
    assert _sent(mail) == []


def test_in_an_async_saga_the_deferred_call_runs_after_the_commit(
    tmp_path: Path, mail: Path
) -> None:
    wal = str(tmp_path / "a.wal")

    async def main() -> None:
        async with saga("order", wal_path=wal, approver=APPROVE):
            placeholder = await send_mail(to="bob@example.com", subject="async")
            assert isinstance(placeholder, Deferred)
            assert _sent(mail) == []

    asyncio.run(main())
    assert [m["to"] for m in _sent(mail)] == ["bob@example.com"]


def test_a_deferred_call_that_keeps_failing_is_retried_then_escalated(
    tmp_path: Path, mail: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = str(tmp_path / "f.wal")
    monkeypatch.setenv("MAIL_DOWN", "1")
    with saga("order", wal_path=wal, approver=APPROVE) as s:
        send_mail(to="ann@example.com", subject="x")
    recs = _records(wal)
    assert [r["attempt"] for r in recs if r["type"] == "intent"] == [1, 2, 3]
    assert [r["outcome"] for r in recs if r["type"] == "forward_failed"] == ["no_effect"] * 3
    [escalated] = [r for r in recs if r["type"] == "escalated"]
    assert "failed after its saga committed" in escalated["reason"]
    assert escalated["saga"] == s.id
    assert recs[-1]["type"] == "deferred_done"
    assert recs[-1]["outcome"] == "escalated"


def test_defer_is_only_for_irreversible_tools() -> None:
    with pytest.raises(SagaUsageError, match="defer=True is for IRREVERSIBLE tools"):

        @tool(semantics=ActionSemantics.COMPENSABLE, defer=True, name="deferred_test.bad")
        def bad(n: int) -> int:
            return n
