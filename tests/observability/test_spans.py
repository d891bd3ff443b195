"""The span tree of a saga, with the SDK's in-memory exporter: names, kinds, attributes,
events, links and parentage, exactly; and the trace context each record carries."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from telemetry import Telemetry

from agent_saga import (
    ActionSemantics,
    Compensation,
    Decision,
    GateRefused,
    MaxArgument,
    Receipt,
    saga,
    tool,
)
from agent_saga.adapters._common import CallId
from agent_saga.testing import MemoryLog

COMPENSABLE = ActionSemantics.COMPENSABLE
WORKFLOW_KIND = {
    "openinference.span.kind": "CHAIN",
    "langsmith.span.kind": "chain",
    "langfuse.observation.type": "chain",
}
TOOL_KIND = {
    "openinference.span.kind": "TOOL",
    "langsmith.span.kind": "tool",
    "langfuse.observation.type": "tool",
}
undone: list[str] = []


def _refund(charge_id: str) -> Receipt | None:
    undone.append(charge_id)
    # b's refund is read back (a receipt); a's returns nothing: "unchecked"
    return Receipt.confirmed({"charge": charge_id}) if charge_id == "ch_b" else None


@tool(
    semantics=COMPENSABLE,
    compensate=lambda r: Compensation(fn=_refund, kwargs={"charge_id": r}),
    trace_args=("amount",),
)
def charge(amount: int, customer: str) -> str:
    """Charge a customer."""
    return f"ch_{customer}"


@tool(semantics=COMPENSABLE, compensate=lambda r: Compensation(fn=_refund, kwargs={"charge_id": r}))
async def charge_async(amount: int, customer: str) -> str:
    """Charge a customer, async."""
    return f"ch_{customer}"


@tool(semantics=COMPENSABLE, compensate=lambda r: Compensation(fn=_refund, kwargs={"charge_id": r}))
def transfer(amount: int, to: str) -> str:
    """Move money; no argument opted in to traces."""
    return f"tr_{to}"


@tool(semantics=ActionSemantics.IRREVERSIBLE)
def send_email(to: str) -> str:
    """An effect nothing can undo."""
    return "sent"


def traceparent(span: ReadableSpan) -> str:
    ctx = span.context
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def records(log: MemoryLog, kind: str) -> list[dict[str, Any]]:
    return [r for r in log.records if r["type"] == kind]


def test_a_committed_saga_is_a_workflow_span_with_one_tool_span_per_step(
    telemetry: Telemetry,
) -> None:
    log = MemoryLog()
    with saga("checkout", log=log) as s:
        charge(amount=42, customer="cust-7")
    sg = telemetry.named("invoke_workflow saga checkout")
    st = telemetry.named("execute_tool charge")
    assert len(telemetry.spans()) == 2
    assert sg.kind is SpanKind.INTERNAL
    assert st.kind is SpanKind.INTERNAL
    assert parent_id(sg) is None
    assert parent_id(st) == span_id(sg)
    assert st.context is not None
    assert sg.context is not None
    assert st.context.trace_id == sg.context.trace_id
    assert dict(sg.attributes or {}) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "checkout",
        "agent_saga.saga.id": s.id,
        "agent_saga.saga.outcome": "committed",
        **WORKFLOW_KIND,
    }
    assert dict(st.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "charge",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": f"{s.id}:1",
        "gen_ai.tool.call.arguments": '{"amount": 42}',  # opted in; customer is not
        "agent_saga.saga.id": s.id,
        "agent_saga.step": 1,
        "agent_saga.step.semantics": "compensable",
        "agent_saga.step.attempt": 1,
        "agent_saga.step.outcome": "committed",
        **TOOL_KIND,
    }
    assert st.status.status_code is StatusCode.UNSET
    assert sg.status.status_code is StatusCode.UNSET
    # docs/log-format.md §12.1: the trace context travels in the log.
    assert records(log, "saga_begin")[0]["trace"] == traceparent(sg)
    assert records(log, "intent")[0]["trace"] == traceparent(st)
    steps = telemetry.metrics()["agent_saga.steps"]
    assert steps == [
        (
            {
                "gen_ai.tool.name": "charge",
                "agent_saga.step.semantics": "compensable",
                "agent_saga.step.outcome": "committed",
            },
            1,
        )
    ]


def test_a_rolled_back_saga_links_each_compensation_span_to_its_forward_span(
    telemetry: Telemetry,
) -> None:
    undone.clear()
    snapshots: list[str] = []

    @tool(
        semantics=ActionSemantics.REVERSIBLE,
        snapshot=lambda key: lambda: snapshots.append(key),
        name="set_flag",
    )
    def set_flag(key: str) -> None:
        """An in-process change, restored from its snapshot."""

    log = MemoryLog()
    with pytest.raises(RuntimeError, match="model crashed"), saga("refunds", log=log) as s:
        charge(amount=1, customer="a")
        set_flag("k")
        charge(amount=2, customer="b")
        raise RuntimeError("the model crashed")
    assert undone == ["ch_b", "ch_a"]
    assert snapshots == ["k"]
    sg = telemetry.named("invoke_workflow saga refunds")
    forward = [s_ for s_ in telemetry.spans() if s_.name == "execute_tool charge"]
    comps = [s_ for s_ in telemetry.spans() if s_.name.startswith("compensate ")]
    assert [c.name for c in comps] == [
        "compensate charge",
        "compensate set_flag",
        "compensate charge",
    ]
    by_step = {f.attributes["agent_saga.step"]: f for f in forward}  # type: ignore[index]
    assert sorted(by_step) == [1, 3]  # the REVERSIBLE step (2) has no span of its own
    for comp in comps:
        assert comp.kind is SpanKind.INTERNAL
        assert parent_id(comp) == span_id(sg)
    first, restore, second = comps
    assert [(link.context.span_id, dict(link.attributes or {})) for link in first.links] == [
        (span_id(by_step[3]), {"agent_saga.link.type": "compensates"})
    ]
    assert [(link.context.span_id, dict(link.attributes or {})) for link in second.links] == [
        (span_id(by_step[1]), {"agent_saga.link.type": "compensates"})
    ]
    assert list(restore.links) == []
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "charge",
        "gen_ai.tool.type": "function",
        "agent_saga.saga.id": s.id,
        "agent_saga.step": 3,
        "agent_saga.compensation.tool": "charge",
        "agent_saga.compensation.by": log.owner,
        "agent_saga.compensation.outcome": "compensated",
        "agent_saga.compensation.verification": "verified",
        **TOOL_KIND,
    }
    assert second.attributes is not None
    assert second.attributes["agent_saga.compensation.verification"] == "unchecked"
    assert restore.attributes is not None
    assert restore.attributes["agent_saga.compensation.by"] == "in-process"
    assert sg.attributes is not None
    assert sg.attributes["agent_saga.saga.outcome"] == "rolled_back"
    assert sg.attributes["error.type"] == "RuntimeError"
    assert sg.status.status_code is StatusCode.ERROR
    assert telemetry.metrics()["agent_saga.compensations"] == [
        ({"agent_saga.compensation.outcome": "compensated"}, 3)
    ]


def test_a_refused_step_is_a_guardrail_result_event_without_the_refused_value(
    telemetry: Telemetry,
) -> None:
    log = MemoryLog()
    with (
        pytest.raises(GateRefused),
        saga("big", log=log, policies=[MaxArgument("amount", 10_000)]) as s,
    ):
        transfer(amount=987_654, to="cust-9")
    st = telemetry.named("execute_tool transfer")
    assert parent_id(st) == span_id(telemetry.named("invoke_workflow saga big"))
    assert st.attributes is not None
    assert st.attributes["agent_saga.step.outcome"] == "refused"
    assert st.attributes["error.type"] == "GateRefused"
    assert "agent_saga.step.attempt" not in st.attributes  # no intent, no attempt
    assert st.status.status_code is StatusCode.ERROR
    guardrails = [e for e in st.events if e.name == "gen_ai.guardrail.result"]
    assert [dict(e.attributes or {}) for e in guardrails] == [
        {
            "gen_ai.guardrail.component.name": "agent-saga gate",
            "gen_ai.guardrail.policy.id": "max-argument:amount<=10000",
            "gen_ai.guardrail.result.type": "decision",
            "gen_ai.guardrail.result.value": "refused",
            "gen_ai.guardrail.result.reason": "argument 'amount'=[amount] is above the limit 10000",
            "gen_ai.guardrail.source": "tool_input",
            "gen_ai.tool.name": "transfer",
            "agent_saga.step": 1,
        }
    ]
    assert records(log, "intent") == []
    assert "trace" not in records(log, "gate")[0]
    exceptions = [e for e in st.events if e.name == "exception"]
    assert len(exceptions) == 1
    assert exceptions[0].attributes is not None
    assert "987" not in str(dict(exceptions[0].attributes)), "the refused value never shows"
    assert s.id in str(st.attributes["gen_ai.tool.call.id"])


def test_an_approval_is_an_event_naming_who_approved_and_that_it_was_this_call(
    telemetry: Telemetry,
) -> None:
    def approver(request: Any) -> Decision:
        return Decision.approve("alice", "looks right")

    approver.name = "ops-desk"  # type: ignore[attr-defined]
    with saga("notify", log=MemoryLog(), approver=approver):
        send_email(to="someone@example.com")
    st = telemetry.named("execute_tool send_email")
    assert st.attributes is not None
    assert st.attributes["agent_saga.step.semantics"] == "irreversible"
    assert st.attributes["agent_saga.step.outcome"] == "committed"
    events = [(e.name, dict(e.attributes or {})) for e in st.events]
    assert events == [
        (
            "agent_saga.approval",
            {
                "agent_saga.approval.decision": "approved",
                "agent_saga.approval.by": "alice",
                "agent_saga.approval.approver": "ops-desk",
                "agent_saga.approval.digest_match": True,
                "agent_saga.step": 1,
            },
        ),
        (
            "gen_ai.guardrail.result",
            {
                "gen_ai.guardrail.component.name": "agent-saga gate",
                "gen_ai.guardrail.policy.id": "alice",
                "gen_ai.guardrail.result.type": "decision",
                "gen_ai.guardrail.result.value": "approved",
                "gen_ai.guardrail.result.reason": "looks right",
                "gen_ai.guardrail.source": "tool_input",
                "gen_ai.tool.name": "send_email",
                "agent_saga.step": 1,
            },
        ),
    ]
    assert "someone@example.com" not in str(events)
    waiting = telemetry.metrics()["agent_saga.approvals.waiting"]
    assert waiting == [({"agent_saga.source": "process"}, 0)]


def test_a_frameworks_own_execute_tool_span_for_the_call_is_enriched_not_duplicated(
    telemetry: Telemetry,
) -> None:
    framework = telemetry.tracer_provider.get_tracer("some-framework")
    with saga("framework", log=MemoryLog()) as s:
        with (
            framework.start_as_current_span(
                "execute_tool charge",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "charge",
                    "gen_ai.tool.call.id": "call_abc",
                },
            ),
            CallId("call_abc"),
        ):
            charge(amount=3, customer="c")
    names = [sp.name for sp in telemetry.spans()]
    assert names.count("execute_tool charge") == 1, names
    st = telemetry.named("execute_tool charge")
    assert st.instrumentation_scope is not None
    assert st.instrumentation_scope.name == "some-framework"
    assert st.attributes is not None
    assert st.attributes["gen_ai.tool.call.id"] == "call_abc"  # the framework's, kept
    assert st.attributes["agent_saga.step"] == 1
    assert st.attributes["agent_saga.saga.id"] == s.id
    assert st.attributes["agent_saga.step.outcome"] == "committed"


def test_a_step_under_another_current_span_is_its_child(telemetry: Telemetry) -> None:
    framework = telemetry.tracer_provider.get_tracer("some-framework")
    with saga("agent", log=MemoryLog()), framework.start_as_current_span("invoke_agent support"):
        charge(amount=3, customer="c")
    agent = telemetry.named("invoke_agent support")
    st = telemetry.named("execute_tool charge")
    assert parent_id(st) == span_id(agent)


async def test_async_steps_in_gathered_tasks_are_children_of_the_saga_span(
    telemetry: Telemetry,
) -> None:
    log = MemoryLog()
    async with saga("parallel", log=log):
        await asyncio.gather(*(charge_async(amount=i, customer=f"c{i}") for i in range(3)))
    sg = telemetry.named("invoke_workflow saga parallel")
    steps = [sp for sp in telemetry.spans() if sp.name == "execute_tool charge_async"]
    assert len(steps) == 3
    assert {parent_id(sp) for sp in steps} == {span_id(sg)}
    assert sorted(r["trace"] for r in records(log, "intent")) == sorted(map(traceparent, steps))
    assert trace.get_current_span() is trace.INVALID_SPAN, "every context was detached"


def test_instrument_twice_is_harmless_and_uninstrumented_sagas_log_no_trace(
    telemetry: Telemetry,
) -> None:
    from agent_saga.observability import instrument, instrumented, uninstrument

    instrument()  # a second call changes nothing: still the in-memory providers
    with saga("twice", log=MemoryLog()):
        charge(amount=1, customer="x")
    assert [s.name for s in telemetry.spans()] == [
        "execute_tool charge",
        "invoke_workflow saga twice",
    ]
    uninstrument()
    assert not instrumented()
    log = MemoryLog()
    with saga("untraced", log=log):
        charge(amount=1, customer="x")
    assert len(telemetry.spans()) == 2
    assert all("trace" not in r for r in log.records)
