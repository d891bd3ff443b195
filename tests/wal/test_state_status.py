"""SagaFold's status and history of a saga: derived from all its records, held or forgotten.

A status is what is true now (``wal/status.py``): an escalation closed later, by a
person or by a retry that undid the step, changes it; the outcome never does. A fold
that dropped a saga's detail (``forget_terminal``) keeps a summary whose status
follows those later records too, so every fold mode says the same of every saga.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_saga.wal import records as r
from agent_saga.wal.state import SagaFold


class Log:
    """(offset, record) pairs the way writers append them."""

    def __init__(self) -> None:
        self.items: list[tuple[int, dict[str, Any]]] = []

    def add(self, rtype: str, **fields: Any) -> Log:
        fields.setdefault("ts", 1000.0 + len(self.items))
        self.items.append((len(self.items) * 100, {"type": rtype, **fields}))
        return self

    def ended_escalated(self, saga: str, *escalations: str) -> Log:
        self.add(r.SAGA_BEGIN, saga=saga, name="n", owner="o1")
        for n, eid in enumerate(escalations, 1):
            self.add(r.INTENT, saga=saga, step=n, attempt=1, tool="t", semantics="compensable",
                     kwargs={}, idempotency_key=r.idempotency_key(saga, n))  # fmt: skip
            self.add(r.COMMITTED, saga=saga, step=n, attempt=1, handler="h", kwargs={},
                     token=r.recovery_token(saga, n))  # fmt: skip
            self.add(r.ESCALATED, saga=saga, step=n, escalation=eid, reason="refund failed",
                     by="o1")  # fmt: skip
        return self.add(r.SAGA_END, saga=saga, outcome="escalated", by="o1")

    def resolve(self, eid: str, by: str) -> Log:
        return self.add(r.ESCALATION_RESOLVED, escalation=eid, note="done", by=by)

    def retry(self, saga: str, step: int, eid: str, *, claimed: bool = True) -> Log:
        self.add(r.ESCALATION_RETRY, escalation=eid, saga=saga, step=step, note="fixed", by="ops")
        if claimed:
            self.add(r.CLAIM, saga=saga, by="d", expires=5000.0, fence=1, retry=eid, steps=[])
        return self

    def undone(self, saga: str, step: int, eid: str) -> Log:
        token = r.recovery_token(saga, step)
        self.add(r.COMPENSATING, saga=saga, step=step, token=token, by="d")
        self.add(r.COMPENSATED, saga=saga, step=step, token=token, by="d")
        return self.resolve(eid, "d")

    def statuses(self, **kw: Any) -> tuple[dict[str, str], int]:
        """Every saga's status after the whole log, from a fold built with ``kw`` (a
        streaming fold: as it settled), and how many records came too late for that."""
        settled: dict[str, str] = {}
        if kw.get("on_settled"):
            kw["on_settled"] = lambda v: settled.__setitem__(v.saga_id, v.status)
        f = SagaFold(**kw)
        for off, rec in self.items:
            f.apply(rec, off)
        out = {v.saga_id: v.status for v in f.sagas()}
        return {**settled, **out}, f.late_records


#: A story, its saga's status, and the status a streaming reader printed when it settled
#: (``runs`` reports the records that came after that on stderr).
STORIES: dict[str, tuple[Log, str] | tuple[Log, str, str]] = {
    "escalated and left open": (Log().ended_escalated("s", "e1"), "escalated"),
    "resolved by a person": (Log().ended_escalated("s", "e1").resolve("e1", "alice"), "resolved"),
    "retried and undone": (
        Log().ended_escalated("s", "e1").retry("s", 1, "e1").undone("s", 1, "e1"),
        "rolled_back",
    ),
    "a retry being carried out": (
        Log().ended_escalated("s", "e1").retry("s", 1, "e1"),
        "recovering",
    ),
    "a retry asked, no daemon yet": (
        Log().ended_escalated("s", "e1").retry("s", 1, "e1", claimed=False),
        "escalated",
    ),
    "a retry that failed again": (
        Log()
        .ended_escalated("s", "e1")
        .retry("s", 1, "e1")
        .add(r.ESCALATED, saga="s", step=1, escalation="e1", reason="again", by="d"),
        "escalated",
    ),
    "one undone by a retry, one by a person": (
        Log()
        .ended_escalated("s", "e1", "e2")
        .retry("s", 2, "e2")
        .undone("s", 2, "e2")
        .resolve("e1", "alice"),
        "resolved",
    ),
    "a person resolves while the daemon retries": (
        Log().ended_escalated("s", "e1").retry("s", 1, "e1").resolve("e1", "alice"),
        "resolved",
    ),
    "committed, then a late escalation": (
        Log()
        .add(r.SAGA_BEGIN, saga="s", name="n", owner="o1")
        .add(r.SAGA_END, saga="s", outcome="committed", by="o1")
        .add(r.ESCALATED, saga="s", step=None, escalation="late", reason="fenced", by="o1"),
        "escalated",
        "committed",
    ),
    "resolved, then a late escalation, resolved again": (
        Log()
        .ended_escalated("s", "e1")
        .resolve("e1", "alice")
        .add(r.ESCALATED, saga="s", step=None, escalation="late", reason="fenced", by="o1")
        .resolve("late", "bob"),
        "resolved",
        "resolved",
    ),
}

MODES: dict[str, dict[str, Any]] = {
    "whole": {},
    "forgetting": {"forget_terminal": True},
    "forgetting, keeping resolved": {"forget_terminal": True, "keep_resolved": True},
    "streaming": {"forget_terminal": True, "remember_ended": False, "on_settled": True},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("story", list(STORIES))
def test_every_fold_mode_gives_a_saga_the_status_its_records_say(story: str, mode: str) -> None:
    log, status, *streamed = STORIES[story]
    got, late = log.statuses(**MODES[mode])
    if mode == "streaming" and streamed:
        assert (got, late > 0) == ({"s": streamed[0]}, True), "printed, then told late"
    else:
        assert got == {"s": status}


def test_the_outcome_stays_what_saga_end_recorded() -> None:
    log = Log().ended_escalated("s", "e1").retry("s", 1, "e1").undone("s", 1, "e1")
    f = SagaFold()
    for off, rec in log.items:
        f.apply(rec, off)
    v = f.get("s")
    assert v is not None
    assert (v.outcome, v.status) == ("escalated", "rolled_back")


def test_the_history_says_who_escalated_retried_and_compensated() -> None:
    log = Log().ended_escalated("s", "e1").retry("s", 1, "e1").undone("s", 1, "e1")
    f = SagaFold()
    for off, rec in log.items:
        f.apply(rec, off)
    v = f.get("s")
    assert v is not None
    assert [(e.event, e.by) for e in v.history] == [
        ("started", "o1"),
        ("escalated", "o1"),
        ("ended", "o1"),
        ("retry_requested", "ops"),
        ("claimed", "d"),
        ("compensated", "d"),
        ("resolved", "d"),
    ]
    assert v.history[1].detail == "step 1: refund failed (e1)"
    assert v.history[2].detail == "escalated"
    assert v.history[3].ts == 1005.0  # the sixth record


def test_a_daemon_renewing_its_claim_is_one_claimed_event() -> None:
    log = Log().add(r.SAGA_BEGIN, saga="s", name="n", owner="o1")
    for fence in (1, 1, 1):
        log.add(r.CLAIM, saga="s", by="d", expires=5000.0, fence=fence, steps=[])
    log.add(r.CLAIM, saga="s", by="d2", expires=6000.0, fence=2, steps=[])
    f = SagaFold()
    for off, rec in log.items:
        f.apply(rec, off)
    v = f.get("s")
    assert v is not None
    assert [(e.event, e.by) for e in v.history] == [
        ("started", "o1"),
        ("claimed", "d"),
        ("claimed", "d2"),
    ]


def test_a_live_saga_is_recovering_once_claimed_and_rolling_back_once_undoing() -> None:
    log = Log().add(r.SAGA_BEGIN, saga="a", name="n", owner="o1")
    log.add(r.COMPENSATING, saga="a", step=1, token=r.recovery_token("a", 1), by="o1")
    log.add(r.SAGA_BEGIN, saga="b", name="n", owner="o2")
    log.add(r.CLAIM, saga="b", by="d", expires=5000.0, fence=1, steps=[])
    log.add(r.COMPENSATING, saga="b", step=1, token=r.recovery_token("b", 1), by="d")
    assert log.statuses()[0] == {"a": "rolling_back", "b": "recovering"}
