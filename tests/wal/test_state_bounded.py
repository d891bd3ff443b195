"""Bounded SagaFold: nothing of an ended saga is kept, and a finished saga never comes back."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record
from agent_saga.wal.reader import Damage
from agent_saga.wal.state import SagaFold

RECOVERYD = str(Path(sys.executable).with_name("saga-recoveryd"))


def saga(sid: str, outcome: str = "committed") -> list[dict[str, Any]]:
    return [
        {"type": r.SAGA_BEGIN, "saga": sid, "name": "n", "owner": "o"},
        {"type": r.INTENT, "saga": sid, "step": 1, "attempt": 1, "tool": "t",
         "semantics": "compensable", "kwargs": {"x": 1}, "idempotency_key": "k"},
        {"type": r.COMMITTED, "saga": sid, "step": 1, "attempt": 1, "handler": "h",
         "kwargs": {}, "token": r.recovery_token(sid, 1)},
        {"type": r.SAGA_END, "saga": sid, "outcome": outcome, "by": "o"},
    ]  # fmt: skip


def bounded(**kw: Any) -> SagaFold:
    return SagaFold(forget_terminal=True, remember_ended=False, **kw)


def feed(fold: SagaFold, recs: list[dict[str, Any]], start: int = 0) -> int:
    for i, rec in enumerate(recs):
        fold.apply({**rec, "ts": 1000.0}, start + i)
    return start + len(recs)


def test_bounded_fold_memory_does_not_grow_with_ended_sagas() -> None:
    def held(n: int, **mode: Any) -> int:
        fold = SagaFold(forget_terminal=True, **mode)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        off = 0
        for i in range(n):
            off = feed(fold, saga(f"{i:032x}"), off)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        # The fold's own modules only: writers left running by other tests allocate in
        # agent_saga/wal too (their flusher and lease threads), never in these three.
        mine = [
            tracemalloc.Filter(True, "*agent_saga/wal/state.py"),
            tracemalloc.Filter(True, "*agent_saga/wal/_fold_transitions.py"),
            tracemalloc.Filter(True, "*agent_saga/wal/views.py"),
        ]
        stats = after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
        return sum(s.size_diff for s in stats)

    # The measurement sees what a fold keeps: one summary per saga in summary mode.
    summaries = held(5000)
    assert summaries > 5 * held(500) > 0
    small, big = held(500, remember_ended=False), held(5000, remember_ended=False)
    assert big < 16384, f"ten times the sagas: {small} -> {big} bytes held"
    assert big * 20 < summaries


def test_a_late_step_record_of_a_finished_saga_is_an_anomaly_not_a_new_saga() -> None:
    fold = bounded()
    off = feed(fold, saga("a"))
    stray = {"type": r.INTENT, "saga": "a", "step": 2, "attempt": 1, "tool": "t",
             "semantics": "compensable", "kwargs": {}, "idempotency_key": "k2"}  # fmt: skip
    feed(fold, [stray], off)
    assert fold.non_terminal() == [], "never resurrected"
    assert fold.get("a") is None
    assert [a.kind for a in fold.anomalies] == ["after_end"]
    assert "no saga_begin before it" in fold.anomalies[0].detail
    assert fold.late_records == 1


def test_a_fenced_writers_late_escalation_goes_to_the_queue_not_to_recovery() -> None:
    fold = bounded()
    off = feed(fold, saga("a", "rolled_back"))
    esc = {"type": r.ESCALATED, "saga": "a", "step": 1, "escalation": "e1",
           "reason": "landed after the lease was lost", "by": "o"}  # fmt: skip
    off = feed(fold, [esc], off)
    assert fold.non_terminal() == []
    assert [e.escalation for e in fold.open_escalations()] == ["e1"]
    feed(fold, [{"type": r.ESCALATION_RESOLVED, "escalation": "e1", "note": "", "by": "x"}], off)
    assert fold.escalations() == [], "resolved: nothing left of it"


def test_after_corrupt_damage_an_unknown_sagas_record_opens_an_ownerless_saga() -> None:
    """Its saga_begin may have been in the damaged bytes: recover it, fail closed."""
    fold = bounded()
    fold.note_damage(Damage(0, 10, "corrupt", "bad crc"))
    feed(fold, saga("lost")[1:2])
    (view,) = fold.non_terminal()
    assert (view.saga_id, view.owner, view.begun) == ("lost", None, False)


def test_a_torn_tail_is_not_damage_that_hides_a_saga_begin() -> None:
    fold = bounded()
    fold.note_damage(Damage(0, 10, "torn_tail", "cut short"))
    feed(fold, saga("a") + saga("a")[1:2])
    assert fold.non_terminal() == []


def test_on_settled_holds_a_saga_with_an_open_escalation_until_it_is_resolved() -> None:
    settled: list[str] = []
    fold = bounded(on_settled=lambda v: settled.append(v.saga_id))
    recs = saga("a", "escalated")
    recs.insert(3, {"type": r.ESCALATED, "saga": "a", "step": 1, "escalation": "e1",
                    "reason": "r", "by": "o"})  # fmt: skip
    off = feed(fold, recs + saga("b"))
    assert settled == ["b"]
    assert [v.saga_id for v in fold.terminal()] == ["a"], "held with its detail"
    feed(fold, [{"type": r.ESCALATION_RESOLVED, "escalation": "e1", "note": "", "by": "x"}], off)
    assert settled == ["b", "a"]
    assert list(fold.sagas()) == []


def test_on_settled_needs_forget_terminal() -> None:
    with pytest.raises(ValueError, match="forget_terminal"):
        SagaFold(on_settled=lambda v: None)


def test_recoveryd_writes_nothing_for_late_records_of_finished_sagas(tmp_path: Path) -> None:
    """A real daemon pass over finished sagas and their late records: nothing to recover."""
    wal = tmp_path / "agent.wal"
    late = [
        {"type": r.ESCALATED, "saga": "a", "step": 1, "escalation": "e-late",
         "reason": "completed after this process lost its lease", "by": "o"},
        {"type": r.COMPENSATING, "saga": "b", "step": 1, "token": r.recovery_token("b", 1),
         "by": "stray"},
        {"type": r.SAGA_END, "saga": "b", "outcome": "rolled_back", "by": "stray"},
    ]  # fmt: skip
    recs = saga("a") + saga("b", "rolled_back") + late
    wal.write_bytes(b"".join(encode_record({**rec, "ts": 1000.0}) for rec in recs))
    before = wal.read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    done = subprocess.run(
        [RECOVERYD, "--once", "--wal-path", str(wal), "--claim-seconds", "0.1"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert wal.read_bytes() == before, "no claim, no saga_end: nothing was resurrected"
    assert '"claimed": 0' in done.stdout
