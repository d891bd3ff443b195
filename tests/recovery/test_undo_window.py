"""The undo window (issue 22): ``saga(..., undo_window=...)`` records until when a
committed saga may be undone; past it the plan says why and the undo is refused, and
compaction keeps the saga exactly while it is still undoable."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    register_handler,
    saga,
    tool,
    undo_saga,
)
from agent_saga.cli import main as cli
from agent_saga.errors import SagaUsageError
from agent_saga.wal.compaction import compact
from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

UNDONE: list[int] = []


@register_handler("undo_window.refund")
def _refund(n: int, idempotency_key: str) -> None:
    UNDONE.append(n)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda n: Compensation(handler="undo_window.refund", kwargs={"n": n}),
    name="undo_window.pay",
)
def pay(n: int) -> int:
    return n


def _records(wal: str) -> list[dict[str, Any]]:
    return [i.data for i in open_store(wal).scan() if isinstance(i, Record)]


def test_within_its_window_a_committed_saga_is_undone_and_its_end_says_until_when(
    tmp_path: Path,
) -> None:
    wal = str(tmp_path / "w.wal")
    UNDONE.clear()
    with saga("s", wal_path=wal, undo_window=timedelta(hours=1)) as s:
        pay(1)
    end = next(r for r in _records(wal) if r["type"] == "saga_end")
    assert end["undo_until"] == pytest.approx(end["ts"] + 3600)
    assert undo_saga(s.id, wal_path=wal, reason="wrong", by="ann").outcome == "undone"
    assert UNDONE == [1]


def test_past_its_window_the_plan_says_why_and_the_undo_is_refused_writing_nothing(
    tmp_path: Path,
) -> None:
    wal = str(tmp_path / "p.wal")
    UNDONE.clear()
    with saga("s", wal_path=wal, undo_window=0.2) as s:
        pay(1)
        pay(2)
    time.sleep(0.3)  # the window passes
    plan = undo_saga(s.id, wal_path=wal, reason="too late", by="ann", dry_run=True)
    assert [p.action for p in plan.steps] == ["cannot_undo", "cannot_undo"]
    assert all("undo window ended at" in (p.why or "") for p in plan.steps)
    size = len(_records(wal))
    with pytest.raises(SagaUsageError, match="can no longer be undone: the saga's undo window"):
        undo_saga(s.id, wal_path=wal, reason="too late", by="ann")
    assert len(_records(wal)) == size, "nothing written"
    assert UNDONE == []


def test_runs_shows_until_when_a_saga_is_undoable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wal = str(tmp_path / "r.wal")
    with saga("s", wal_path=wal, undo_window=3600) as s:
        pay(1)
    assert cli(["runs", "--wal-path", wal, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["undo_until"] > time.time()
    assert cli(["runs", s.id, "--wal-path", wal]) == 0
    assert "undoable until" in capsys.readouterr().out


def test_compaction_keeps_a_saga_while_it_can_still_be_undone(tmp_path: Path) -> None:
    wal = str(tmp_path / "c.wal")
    with saga("open", wal_path=wal, undo_window=3600) as kept:
        pay(1)
    with saga("closed", wal_path=wal, undo_window=0.2) as gone:
        pay(2)
    with saga("plain", wal_path=wal) as plain:
        pay(3)
    time.sleep(0.3)
    report = compact(wal, archive=None, retain_seconds=0)
    assert report.sagas_undoable == 1
    sagas = {r.get("saga") for r in _records(wal)}
    assert kept.id in sagas, "still undoable: kept"
    assert gone.id not in sagas, "its window ended: dropped"
    assert plain.id not in sagas, "no window: retention alone decides"
    assert undo_saga(kept.id, wal_path=wal, reason="after compaction", by="ann").outcome == (
        "undone"
    )


@pytest.mark.parametrize("bad", [0, -1, "1h", True])
def test_a_bad_undo_window_is_refused_when_the_saga_is_declared(bad: object) -> None:
    with pytest.raises(SagaUsageError, match="undo_window must be"):
        saga("s", undo_window=bad)  # type: ignore[arg-type]


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda n: Compensation(
        handler="undo_window.refund", kwargs={"n": n}, undo_until=time.time() + (60 if n else -60)
    ),
    name="undo_window.pay_with_limit",
)
def pay_with_limit(n: int) -> int:
    return n


def test_a_step_past_its_services_own_limit_is_planned_as_not_undoable_and_escalated(
    tmp_path: Path,
) -> None:
    wal = str(tmp_path / "l.wal")
    UNDONE.clear()
    with saga("s", wal_path=wal) as s:
        pay_with_limit(0)  # the service took its refund only until a minute ago
        pay_with_limit(7)  # ... and this one's for another minute
    committed = [r for r in _records(wal) if r["type"] == "committed"]
    assert [r["undo_until"] < time.time() for r in committed] == [True, False]
    plan = undo_saga(s.id, wal_path=wal, reason="wrong", by="ann", dry_run=True)
    assert [(p.step, p.action) for p in plan.steps] == [(2, "compensate"), (1, "cannot_undo")]
    assert "its service took the inverse of this step only until" in (plan.steps[1].why or "")
    done = undo_saga(s.id, wal_path=wal, reason="wrong", by="ann")
    assert done.outcome == "escalated"  # step 2 refunded; step 1 is a person's to settle
    assert UNDONE == [7]
    escalated = [r for r in _records(wal) if r["type"] == "escalated"]
    assert [r["step"] for r in escalated] == [1]


def test_a_compensation_limit_that_is_not_a_time_is_refused_where_it_is_made() -> None:
    with pytest.raises(Exception, match="undo_until must be wall-clock seconds"):
        Compensation(handler="h", undo_until="tomorrow")  # type: ignore[arg-type]
    assert Compensation(handler="h", undo_until=5).undo_until == 5.0
