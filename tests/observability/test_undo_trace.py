"""An undo after commit and an operator's retry are traces of their own, linked to the
saga they act on; each compensation inside is linked to the step it undoes. Real WAL
files, the in-memory SDK, the real undo and daemon code in this process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from telemetry import Telemetry

from agent_saga import (
    ActionSemantics,
    Compensation,
    CompensationFailed,
    register_handler,
    saga,
    tool,
    undo_saga,
)
from agent_saga import _crash as crash
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.escalations import list_escalations, request_retry
from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

WORKFLOW_KIND = {
    "openinference.span.kind": "CHAIN",
    "langsmith.span.kind": "chain",
    "langfuse.observation.type": "chain",
}
refunded: list[str] = []
broken = {"refund": False}


def _trace_refund(charge_id: str, idempotency_key: str) -> None:
    if broken["refund"]:
        raise ConnectionError("the payments API is down")
    refunded.append(charge_id)


register_handler("undo_trace.refund", _trace_refund)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="undo_trace.refund", kwargs={"charge_id": r}),
)
def pay(amount: int, customer: str) -> str:
    """Charge a customer."""
    return f"ch_{customer}_{amount}"


def _records(wal: str, kind: str) -> list[dict[str, Any]]:
    return [
        i.data for i in open_store(wal).scan() if isinstance(i, Record) and i.data["type"] == kind
    ]


def _ids(traceparent: str) -> tuple[int, int]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


def _ctx(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def _links(span: ReadableSpan) -> list[tuple[tuple[int, int], dict[str, Any]]]:
    return [
        ((link.context.trace_id, link.context.span_id), dict(link.attributes or {}))
        for link in span.links
    ]


def _committed(wal: str) -> str:
    with saga("order-7", wal_path=wal) as s:
        pay(amount=120, customer="cust-4242")
        pay(amount=80, customer="cust-4242")
    return s.id


@pytest.fixture(autouse=True)
def _reset() -> Any:
    refunded.clear()
    broken["refund"] = False
    yield
    crash.disarm_all()


def test_an_undo_is_a_new_trace_linked_to_the_saga_and_its_steps(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    wal = str(tmp_path / "agent.wal")
    sid = _committed(wal)
    begin = _records(wal, "saga_begin")[0]
    intents = {r["step"]: r for r in _records(wal, "intent")}

    plan = undo_saga(sid, wal_path=wal, reason="wrong customer", by="alice")

    assert plan.outcome == "undone"
    assert refunded == ["ch_cust-4242_80", "ch_cust-4242_120"]
    undo_span = telemetry.named("undo saga order-7")
    assert undo_span.kind is SpanKind.INTERNAL
    assert undo_span.parent is None, "a root: a new trace"
    saga_trace = _ids(begin["trace"])
    assert _ctx(undo_span)[0] != saga_trace[0]
    assert _links(undo_span) == [(saga_trace, {"agent_saga.link.type": "undoes"})]
    assert dict(undo_span.attributes or {}) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "order-7",
        "agent_saga.saga.id": sid,
        "agent_saga.undo.by": "alice",
        "agent_saga.undo.id": plan.undo,
        "agent_saga.undo.outcome": "undone",
        **WORKFLOW_KIND,
    }
    (requested,) = _records(wal, "undo_requested")
    assert _ids(requested["trace"]) == _ctx(undo_span)
    comps = [s for s in telemetry.spans() if s.name.startswith("compensate ")]
    assert [(c.attributes or {})["agent_saga.step"] for c in comps] == [2, 1], "newest first"
    for comp in comps:
        step = (comp.attributes or {})["agent_saga.step"]
        assert comp.parent is not None
        assert comp.parent.span_id == _ctx(undo_span)[1]
        assert _ctx(comp)[0] == _ctx(undo_span)[0]
        assert _links(comp) == [
            (_ids(intents[step]["trace"]), {"agent_saga.link.type": "compensates"})
        ]
        assert (comp.attributes or {})["agent_saga.compensation.outcome"] == "compensated"
    exported = repr([(s.name, s.attributes, s.events) for s in telemetry.spans()])
    assert "cust-4242" not in exported, "an argument value was exported"
    for r in _records(wal, "compensated"):
        assert r["token"] not in exported


def test_a_dead_undoers_undo_finished_by_the_daemon_resumes_its_trace(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    wal = str(tmp_path / "agent.wal")
    sid = _committed(wal)

    class Died(Exception):
        """Stands for the SIGKILL the process tests send at this point."""

    def die_after_request(name: str) -> None:
        if name == "undo.after_request":
            raise Died

    original = crash.crashpoint
    crash.crashpoint = die_after_request  # type: ignore[assignment]
    try:
        with pytest.raises(Died):
            undo_saga(sid, wal_path=wal, reason="wrong customer", by="alice", claim_seconds=0.05)
    finally:
        crash.crashpoint = original  # type: ignore[assignment]
    assert refunded == []
    first = telemetry.named("undo saga order-7")
    assert first.status.status_code is StatusCode.ERROR
    time.sleep(0.1)  # the dead undoer's claim expires

    daemon = RecoveryDaemon(wal, emit=lambda event: None, claim_seconds=5)
    report = daemon.run_once()

    assert report.undos == 1
    assert refunded == ["ch_cust-4242_80", "ch_cust-4242_120"]
    spans = [s for s in telemetry.spans() if s.name == "undo saga order-7"]
    assert len(spans) == 2
    takeover = spans[1]
    begin = _records(wal, "saga_begin")[0]
    assert _links(takeover) == [
        (_ids(begin["trace"]), {"agent_saga.link.type": "undoes"}),
        (_ctx(first), {"agent_saga.link.type": "resumes"}),
    ]
    attributes = dict(takeover.attributes or {})
    assert attributes["agent_saga.undo.by"] == daemon.id
    assert attributes["agent_saga.undo.outcome"] == "undone"
    claims = [c for c in _records(wal, "claim") if c.get("undo")]
    assert _ids(claims[-1]["trace"]) == _ctx(takeover)
    comps = [s for s in telemetry.spans() if s.name.startswith("compensate ")]
    assert [c.parent.span_id if c.parent else None for c in comps] == [_ctx(takeover)[1]] * 2


def test_an_operators_retry_is_a_trace_linked_to_the_saga(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    wal = str(tmp_path / "agent.wal")
    broken["refund"] = True
    with pytest.raises(CompensationFailed), saga("order-9", wal_path=wal) as s:
        pay(amount=5, customer="cust-777")
        raise RuntimeError("the agent went wrong")
    (escalation,) = list_escalations(wal)
    broken["refund"] = False
    request_retry(wal, escalation.escalation, note="payments API is back", by="bob")

    daemon = RecoveryDaemon(wal, emit=lambda event: None, claim_seconds=5)
    daemon.run_once()

    assert refunded == ["ch_cust-777_5"]
    retry = telemetry.named("retry saga order-9")
    assert retry.parent is None
    begin = _records(wal, "saga_begin")[0]
    assert _links(retry) == [(_ids(begin["trace"]), {"agent_saga.link.type": "retries"})]
    assert dict(retry.attributes or {}) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "order-9",
        "agent_saga.saga.id": s.id,
        "agent_saga.recovery.by": daemon.id,
        "agent_saga.retry.escalation": escalation.escalation,
        "agent_saga.step": 1,
        "agent_saga.retry.outcome": "compensated",
        **WORKFLOW_KIND,
    }
    comp = [c for c in telemetry.spans() if c.name.startswith("compensate ")][-1]
    assert comp.parent is not None
    assert comp.parent.span_id == _ctx(retry)[1]
    assert "cust-777" not in repr([(x.name, x.attributes, x.events) for x in telemetry.spans()])
