"""SagaFold: records in, saga views out (pure; no files except fold_file)."""

from __future__ import annotations

import importlib
import tracemalloc
from typing import Any

import pytest

from agent_saga.wal import records as r
from agent_saga.wal.state import SagaFold, StepView


class Log:
    """Builds a list of (offset, record) pairs the way writers would."""

    def __init__(self) -> None:
        self.items: list[tuple[int, dict[str, Any]]] = []

    def add(self, rtype: str, **fields: Any) -> Log:
        fields.setdefault("ts", 1000.0 + len(self.items))
        self.items.append((len(self.items) * 100, {"type": rtype, **fields}))
        return self

    def begin(self, saga: str, name: str = "n", owner: str = "o1") -> Log:
        return self.add(r.SAGA_BEGIN, saga=saga, name=name, owner=owner)

    def intent(self, saga: str, step: int, attempt: int = 1, **extra: Any) -> Log:
        return self.add(
            r.INTENT,
            saga=saga,
            step=step,
            attempt=attempt,
            tool=f"t{step}",
            semantics="compensable",
            kwargs={"x": step},
            idempotency_key=r.idempotency_key(saga, step),
            **extra,
        )

    def committed(self, saga: str, step: int, attempt: int = 1) -> Log:
        return self.add(
            r.COMMITTED,
            saga=saga,
            step=step,
            attempt=attempt,
            handler="h",
            kwargs={"undo": step},
            token=r.recovery_token(saga, step),
        )

    def failed(self, saga: str, step: int, outcome: str, attempt: int = 1) -> Log:
        return self.add(
            r.FORWARD_FAILED, saga=saga, step=step, attempt=attempt, outcome=outcome, error="boom"
        )

    def undo(self, rtype: str, saga: str, step: int, **extra: Any) -> Log:
        return self.add(
            rtype, saga=saga, step=step, token=r.recovery_token(saga, step), by="d", **extra
        )

    def end(self, saga: str, outcome: str = "committed") -> Log:
        return self.add(r.SAGA_END, saga=saga, outcome=outcome, by="o1")

    def fold(self, **kw: Any) -> SagaFold:
        f = SagaFold(**kw)
        for off, rec in self.items:
            f.apply(rec, off)
        return f


def steps(views: list[StepView]) -> list[int]:
    return [s.step for s in views]


def test_committed_saga_is_terminal_with_committed_steps() -> None:
    f = Log().begin("s").intent("s", 1).committed("s", 1).end("s").fold()
    v = f.get("s")
    assert v is not None
    assert v.status == "committed"
    assert v.terminal
    assert v.name == "n"
    assert v.owner == "o1"
    assert v.started == 1000.0
    assert v.ended == 1003.0
    s = v.steps[1]
    assert (s.state, s.handler, s.compensation_kwargs, s.kwargs) == (
        "committed",
        "h",
        {"undo": 1},
        {"x": 1},
    )
    assert s.token == r.recovery_token("s", 1)
    assert s.order == 0
    assert f.non_terminal() == []
    assert [x.saga_id for x in f.terminal()] == ["s"]


def test_saga_without_end_is_running_even_after_last_compensation() -> None:
    log = Log().begin("s").intent("s", 1).committed("s", 1)
    log.undo(r.COMPENSATING, "s", 1).undo(r.COMPENSATED, "s", 1)
    f = log.fold()
    v = f.get("s")
    assert v is not None
    assert v.status == "rolling_back"
    assert not v.terminal
    assert v.steps[1].state == "compensated"
    assert [x.saga_id for x in f.non_terminal()] == ["s"]


def test_dangling_intent_and_unknown_outcome_need_undo_but_no_effect_does_not() -> None:
    log = Log().begin("s").intent("s", 1).committed("s", 1)
    log.intent("s", 2).failed("s", 2, "no_effect")
    log.intent("s", 3).failed("s", 3, "unknown")
    log.intent("s", 4)
    f = log.fold()
    v = f.get("s")
    assert v is not None
    assert [v.steps[i].state for i in (1, 2, 3, 4)] == [
        "committed",
        "no_effect",
        "unknown",
        "intent",
    ]
    assert steps(f.unwind_order("s")) == [4, 3, 1]


def test_unwind_order_follows_commit_order_not_step_numbers() -> None:
    # step 1 started first but finished last: it is undone first
    log = Log().begin("s").intent("s", 1).intent("s", 2).committed("s", 2).committed("s", 1)
    f = log.fold()
    assert steps(f.unwind_order("s")) == [1, 2]
    v = f.get("s")
    assert v is not None
    assert (v.steps[2].order, v.steps[1].order) == (0, 1)


def test_retry_after_unknown_attempt_keeps_step_in_unwind_order() -> None:
    log = Log().begin("s").intent("s", 1).failed("s", 1, "unknown")
    log.intent("s", 2).committed("s", 2)
    log.intent("s", 1, attempt=2).failed("s", 1, "no_effect", attempt=2)
    f = log.fold()
    v = f.get("s")
    assert v is not None
    assert v.steps[1].attempts == 2
    assert v.steps[1].state == "unknown"  # attempt 1 may still have landed
    # keyed by the unknown attempt's record, which precedes step 2's commit
    assert steps(f.unwind_order("s")) == [2, 1]


def test_compensated_and_escalated_steps_leave_unwind_order() -> None:
    log = Log().begin("s")
    for i in (1, 2, 3):
        log.intent("s", i).committed("s", i)
    log.undo(r.COMPENSATING, "s", 3).undo(r.COMPENSATED, "s", 3)
    log.undo(r.COMPENSATING, "s", 2)
    log.undo(r.COMPENSATION_FAILED, "s", 2, attempt=1, error="x", final=True)
    log.add(r.ESCALATED, saga="s", step=2, escalation="e1", reason="handler failed", by="d")
    f = log.fold()
    assert steps(f.unwind_order("s")) == [1]
    assert steps(f.unwind_order("s", include_escalated=True)) == [2, 1]
    v = f.get("s")
    assert v is not None
    assert v.steps[2].state == "escalated"
    assert v.steps[2].escalation == "e1"


def test_compensation_failed_not_final_is_retried() -> None:
    log = Log().begin("s").intent("s", 1).committed("s", 1)
    log.undo(r.COMPENSATION_FAILED, "s", 1, attempt=1, error="503", final=False)
    f = log.fold()
    v = f.get("s")
    assert v is not None
    assert v.steps[1].state == "compensation_failed"
    assert not v.steps[1].final_failure
    assert steps(f.unwind_order("s")) == [1]


def test_open_escalations_exclude_resolved_ones() -> None:
    log = Log().begin("s").intent("s", 1)
    log.add(r.ESCALATED, saga="s", step=1, escalation="e1", reason="cannot tell", by="d")
    log.add(r.ESCALATED, saga="s", step=None, escalation="e2", reason="saga-level", by="d")
    log.end("s", "escalated")
    log.add(r.ESCALATION_RESOLVED, escalation="e1", note="refunded by hand", by="alice")
    f = log.fold()
    assert [e.escalation for e in f.open_escalations()] == ["e2"]
    e1 = next(e for e in f.escalations() if e.escalation == "e1")
    assert e1.resolved
    assert e1.note == "refunded by hand"
    assert e1.resolved_by == "alice"
    v = f.get("s")
    assert v is not None
    assert v.status == "escalated"
    assert v.escalations == ["e1", "e2"]


def test_claim_marks_saga_recovering_and_keeps_highest_fence() -> None:
    log = Log().begin("s").intent("s", 1).committed("s", 1)
    log.add(r.CLAIM, saga="s", by="d1", expires=2000.0, fence=1)
    log.add(r.CLAIM, saga="s", by="d2", expires=3000.0, fence=2)
    v = log.fold().get("s")
    assert v is not None
    assert v.status == "recovering"
    assert v.claim is not None
    assert (v.claim.by, v.claim.fence) == ("d2", 2)


def test_gate_refusal_is_a_step_that_needs_no_undo() -> None:
    log = (
        Log()
        .begin("s")
        .add(
            r.GATE,
            saga="s",
            step=1,
            tool="wire",
            semantics="irreversible",
            decision="refused",
            decided_by="deny-all",
            reason="no approver",
        )
    )
    f = log.fold()
    v = f.get("s")
    assert v is not None
    assert v.steps[1].state == "refused"
    assert f.unwind_order("s") == []


@pytest.mark.parametrize(
    "record",
    [
        {"type": "nonsense", "saga": "s"},
        {"saga": "s"},
        {"type": 7},
        {
            "type": r.INTENT,
            "saga": "s",
            "step": "1",
            "attempt": 1,
            "tool": "t",
            "semantics": "c",
            "kwargs": {},
            "idempotency_key": "k",
        },
        {"type": r.COMMITTED, "saga": "s", "step": 1},
        {"type": r.SAGA_END, "saga": "s", "outcome": "maybe", "by": "x"},
        {"type": r.SAGA_END, "saga": ["s"], "outcome": "committed", "by": "x"},
        {"type": r.CLAIM, "saga": "s", "by": "d", "expires": "soon", "fence": 1},
        {
            "type": r.INTENT,
            "saga": "s",
            "step": True,
            "attempt": 1,
            "tool": "t",
            "semantics": "c",
            "kwargs": {},
            "idempotency_key": "k",
        },
        {"type": r.ESCALATION_RESOLVED, "escalation": "nobody", "note": "", "by": "x"},
        {"type": r.SAGA_BEGIN, "saga": "s", "name": "n", "owner": "o", "ts": "yesterday"},
    ],
)
def test_malformed_or_unknown_records_are_anomalies_not_errors(record: dict[str, Any]) -> None:
    f = SagaFold()
    f.apply({"type": r.SAGA_BEGIN, "saga": "s", "name": "n", "owner": "o", "ts": 1.0}, 0)
    f.apply(record, 40)
    assert f.anomaly_count == 1
    assert f.anomalies[0].offset == 40
    v = f.get("s")
    assert v is not None
    assert not v.terminal
    assert v.steps == {}


def test_non_mapping_record_is_an_anomaly() -> None:
    f = SagaFold()
    f.apply([1, 2], 7)  # type: ignore[arg-type]
    assert [(a.offset, a.kind) for a in f.anomalies] == [(7, "malformed")]


def test_ignored_committed_record_leaves_step_dangling_fail_closed() -> None:
    log = Log().begin("s").intent("s", 1)
    log.add(r.COMMITTED, saga="s", step=1, attempt=1, handler=3, kwargs={}, token="t")
    f = log.fold()
    v = f.get("s")
    assert v is not None
    assert v.steps[1].state == "intent"
    assert f.anomaly_count == 1


def test_records_after_saga_end_are_reported() -> None:
    log = Log().begin("s").end("s").intent("s", 1)
    f = log.fold()
    assert [a.kind for a in f.anomalies] == ["after_end"]


def test_forget_terminal_keeps_status_and_drops_detail() -> None:
    log = Log().begin("a").intent("a", 1).committed("a", 1).end("a").begin("b").intent("b", 1)
    f = log.fold(forget_terminal=True)
    a = f.get("a")
    assert a is not None
    assert a.forgotten
    assert a.status == "committed"
    assert a.steps == {}
    assert f.is_terminal("a")
    assert not f.is_terminal("b")
    assert [v.saga_id for v in f.sagas()] == ["b", "a"]


def test_forget_terminal_keeps_open_escalations() -> None:
    log = Log().begin("s").intent("s", 1)
    log.add(r.ESCALATED, saga="s", step=1, escalation="e1", reason="r", by="d")
    log.end("s", "escalated")
    f = log.fold(forget_terminal=True)
    assert [e.escalation for e in f.open_escalations()] == ["e1"]
    f.apply({"type": r.ESCALATION_RESOLVED, "escalation": "e1", "note": "", "by": "x"}, 9999)
    assert f.open_escalations() == []
    assert f.anomaly_count == 0


def test_forget_terminal_method_drops_detail_later() -> None:
    f = Log().begin("a").end("a").begin("b").fold()
    assert f.forget_terminal() == 1
    a = f.get("a")
    assert a is not None
    assert a.forgotten
    f.forget_terminal(keep_summary=False)
    assert f.get("a") is None
    assert f.get("b") is not None


def test_memory_grows_with_live_sagas_not_with_log_length() -> None:
    def run(n: int) -> int:
        # Bounded mode: no summary either (a 2-tuple per saga, which CPython's tuple
        # free list keeps attributed to the fold long after it was freed).
        f = SagaFold(forget_terminal=True, remember_ended=False)
        logs = [
            Log().begin(f"s{i}").intent(f"s{i}", 1).committed(f"s{i}", 1).end(f"s{i}")
            for i in range(n)
        ]
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        off = 0
        for log in logs:
            for rec in log.items:
                f.apply(rec[1], off)
                off += 100
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        # Only what the fold's own modules hold: other threads of the test process
        # (writers left by earlier tests) allocate meanwhile too.
        mine = [tracemalloc.Filter(True, "*agent_saga/wal/*")]
        stats = after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
        return sum(s.size_diff for s in stats)

    small, big = run(200), run(2000)
    assert small > 0, "the measurement sees the fold's allocations"
    assert big < small * 3, (small, big)


def test_feed_collects_damage_and_resume_position() -> None:
    reader = importlib.import_module("agent_saga.wal.reader")
    f = SagaFold()
    f.feed(
        [
            reader.Record(0, 50, {"type": r.SAGA_BEGIN, "saga": "s", "name": "n", "owner": "o"}),
            reader.Damage(50, 10, "corrupt", "bad crc"),
            reader.Record(
                60, 110, {"type": r.SAGA_END, "saga": "s", "outcome": "committed", "by": "o"}
            ),
        ]
    )
    assert f.position == 110
    assert [d.offset for d in f.damages] == [50]
    v = f.get("s")
    assert v is not None
    assert v.status == "committed"
