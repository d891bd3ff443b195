"""The saga document's undo runs and undo order, from hand-written records (no server)."""

from __future__ import annotations

from typing import Any

from agent_saga.ui._api import _step_json
from agent_saga.ui._index import SagaDetail
from agent_saga.ui._timeline import decorate_steps, undo_order
from agent_saga.wal.state import SagaFold

SAGA = "s-1"


def _detail(records: list[dict[str, Any]]) -> tuple[SagaDetail, dict[int, dict[str, Any]]]:
    fold = SagaFold()
    placed = []
    for i, rec in enumerate(records):
        rec = {"saga": SAGA, "ts": 1000.0 + i, **rec}
        fold.apply(rec, i * 100)
        placed.append((i * 100, rec))
    view = fold.get(SAGA)
    assert view is not None
    steps = {n: _step_json(s) for n, s in sorted(view.steps.items())}
    detail = SagaDetail(view, placed, [(None, None, view.status)] * len(placed), False)
    decorate_steps(detail, steps)
    return detail, steps


def _forward(n: int) -> list[dict[str, Any]]:
    common = {"step": n, "attempt": 1}
    return [
        {
            "type": "intent",
            **common,
            "tool": "t",
            "semantics": "compensable",
            "kwargs": {},
            "idempotency_key": f"k{n}",
        },
        {"type": "committed", **common, "handler": "h", "kwargs": {}, "token": f"tok{n}"},
    ]


def _undo(kind: str, n: int, by: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "step": n, "token": f"tok{n}", "by": by, **extra}


def _escalated(n: int, reason: str = "handler not registered") -> dict[str, Any]:
    return {"type": "escalated", "step": n, "escalation": f"esc-{n}", "reason": reason, "by": "d"}


def _retry(n: int, note: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "escalation_retry",
            "escalation": f"esc-{n}",
            "step": n,
            "note": note,
            "by": "ops",
        },
        {"type": "claim", "by": "d2", "expires": 9e9, "fence": 2, "retry": f"esc-{n}"},
    ]


def test_retries_are_runs_and_the_undo_order_follows_completion_not_the_log() -> None:
    records = [{"type": "saga_begin", "name": "n", "owner": "o"}]
    for n in (1, 2, 3):
        records += _forward(n)
    records += [_escalated(3), _escalated(2), _escalated(1)]
    records.append({"type": "saga_end", "outcome": "escalated", "by": "d"})
    # The operator retries oldest first; step 2's first retry fails again.
    for n, ok in ((1, True), (2, False), (3, True), (2, True)):
        records += _retry(n, f"retry {n}")
        records.append(_undo("compensating", n, "d2"))
        if ok:
            records.append(_undo("compensated", n, "d2"))
            records.append(
                {"type": "escalation_resolved", "escalation": f"esc-{n}", "by": "d2", "note": "ok"}
            )
        else:
            records.append(
                _undo("compensation_failed", n, "d2", attempt=1, error="down", final=True)
            )
            records.append(_escalated(n, "compensation failed past its retry budget"))
    detail, steps = _detail(records)
    assert undo_order(detail.view, steps) == [3, 2, 1]
    two = steps[2]["undo_runs"]
    assert [r["outcome"] for r in two] == ["failed", "compensated"]
    assert [r["retry"]["note"] for r in two] == ["retry 2", "retry 2"]
    assert two[0]["escalated"] == "compensation failed past its retry budget"
    assert two[0]["attempts"] == 1
    assert all(r["by"] == "d2" for r in two)
    claim = next(i for i, r in enumerate(records) if r.get("type") == "claim")
    assert steps[1]["undo_runs"][0]["from_i"] == claim  # the retry's claim starts its run


def test_a_compensation_cut_short_by_a_crash_is_an_interrupted_run() -> None:
    records = [{"type": "saga_begin", "name": "n", "owner": "o"}, *_forward(1), *_forward(2)]
    records.append(_undo("compensating", 2, "agent"))  # then SIGKILL
    records.append({"type": "claim", "by": "d", "expires": 9e9, "fence": 1})
    records += [_undo("compensating", 2, "d"), _undo("compensated", 2, "d")]
    records += [_undo("compensating", 1, "d"), _undo("compensated", 1, "d")]
    detail, steps = _detail(records)
    assert undo_order(detail.view, steps) == [2, 1]
    runs = steps[2]["undo_runs"]
    assert [(r["by"], r["outcome"]) for r in runs] == [
        ("agent", "interrupted"),
        ("d", "compensated"),
    ]
    assert runs[0]["end"] == runs[0]["start"]  # it ended at its last record
    assert runs[1]["retry"] is None


def test_an_escalation_with_no_undo_attempt_is_no_run() -> None:
    records = [{"type": "saga_begin", "name": "n", "owner": "o"}, *_forward(1), _escalated(1)]
    detail, steps = _detail(records)
    assert steps[1]["undo_runs"] == []
    assert undo_order(detail.view, steps) == []
