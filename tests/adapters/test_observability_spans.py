"""Inside the frameworks' real agent loops (scripted models): the step's span is the
framework's own tool span, enriched, or a child of the framework's span — never a
duplicate beside it.

No framework speaks OpenTelemetry by itself; its instrumentation does. These tests
install the real OpenInference instrumentors (the ones users install) on the test's
tracer provider and look at the tool span each one makes current while the tool runs:

* OpenAI Agents SDK: ``charge`` (TOOL, no call id), current -> enriched;
* CrewAI: no tool span for a ReAct tool call; the task's AGENT span is current -> child;
* LlamaIndex: ``FunctionTool.acall`` (TOOL, ``tool.name``), current -> child;
* AutoGen: ``{agent}.{tool}`` (TOOL, ``tool.name``), current -> child;
* LangGraph: ``charge`` (TOOL), which OpenInference's LangChain tracer never makes
  current (a callback handler cannot be sure to detach a context); the adapter makes
  the tool run's span current around the step (the handler's ``get_span(run_id)``)
  -> child.

The instrumentors hide inputs and outputs (``TraceConfig``), as an application that
keeps arguments out of its traces configures them: then no argument value is in any
exported attribute, agent-saga's or the framework's.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from adapter_handlers import COMPENSABLE, charge, compensate_charge
from drivers import driver
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from scripted import Call

from agent_saga.observability import instrument, uninstrument

#: The call's argument: in no exported attribute.
SECRET = "ch_secret_4242"
KIND = "openinference.span.kind"
AGENT_SAGA = "agent_saga"

#: Framework -> the OpenInference instrumentor of its real agent loop.
INSTRUMENTORS = {
    "openai-agents": ("openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor"),
    "crewai": ("openinference.instrumentation.crewai", "CrewAIInstrumentor"),
    "llamaindex": ("openinference.instrumentation.llama_index", "LlamaIndexInstrumentor"),
    "autogen": ("openinference.instrumentation.autogen_agentchat", "AutogenAgentChatInstrumentor"),
    "langgraph": ("openinference.instrumentation.langchain", "LangChainInstrumentor"),
}


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    # The adapter tests keep every framework's telemetry off; these turn tracing on.
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(tracer_provider=provider)
    try:
        yield exporter, provider
    finally:
        uninstrument()
        provider.shutdown()


@contextmanager
def openinference(framework: str, provider: TracerProvider) -> Iterator[None]:
    """The framework's real OpenInference instrumentor, installed for the block only."""
    from openinference.instrumentation import TraceConfig

    module, name = INSTRUMENTORS[framework]
    instrumentor = getattr(importlib.import_module(module), name)()
    instrumentor.instrument(
        tracer_provider=provider, config=TraceConfig(hide_inputs=True, hide_outputs=True)
    )
    tracing = None
    if framework == "openai-agents":
        import agents

        tracing = agents  # the conftest disables the SDK's tracing for every test
        agents.set_tracing_disabled(False)
    try:
        yield
    finally:
        if tracing is not None:
            tracing.set_tracing_disabled(True)
        instrumentor.uninstrument()


async def _run_charge(framework: str, wal: str) -> None:
    fw = driver(framework)
    tool = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    await fw.run(fw.target([tool], [[Call("charge", {"charge_id": SECRET})], "done"]), wal_path=wal)


def _by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans if s.context is not None}


def _parent(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    return _by_id(spans).get(span.parent.span_id) if span.parent is not None else None


def _scope(span: ReadableSpan) -> str:
    assert span.instrumentation_scope is not None
    return span.instrumentation_scope.name


def _saga(spans: list[ReadableSpan]) -> ReadableSpan:
    (saga,) = [s for s in spans if s.name.startswith("invoke_workflow saga")]
    return saga


def _tool_spans(spans: list[ReadableSpan], tool: str) -> list[ReadableSpan]:
    """Every span that stands for one call of ``tool``: the framework's and agent-saga's."""
    out = []
    for s in spans:
        a: Mapping[str, Any] = s.attributes or {}
        if (
            a.get("gen_ai.tool.name") == tool
            or s.name in (tool, f"execute_tool {tool}")
            or (a.get(KIND) == "TOOL" and a.get("tool.name") == tool)
        ):
            out.append(s)
    return out


def _assert_step_attributes(span: ReadableSpan, saga: ReadableSpan) -> dict[str, Any]:
    attrs = dict(span.attributes or {})
    assert attrs["agent_saga.step"] == 1
    assert attrs["agent_saga.step.semantics"] == "compensable"
    assert attrs["agent_saga.step.outcome"] == "committed"
    assert attrs["agent_saga.saga.id"] == (saga.attributes or {})["agent_saga.saga.id"]
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "charge"
    assert span.context is not None
    assert saga.context is not None
    assert span.context.trace_id == saga.context.trace_id
    return attrs


def _assert_no_argument_value(
    spans: list[ReadableSpan], *, leaks: frozenset[str] = frozenset()
) -> None:
    """``SECRET`` is in no exported attribute (``leaks``: a third party's, not ours)."""
    for s in spans:
        items = list((s.attributes or {}).items())
        items += [(k, v) for e in s.events for k, v in (e.attributes or {}).items()]
        for key, value in items:
            if key in leaks and _scope(s) != AGENT_SAGA:
                continue
            assert SECRET not in str(value), (s.name, _scope(s), key)


def _assert_own_child_of(
    spans: list[ReadableSpan], framework_span: ReadableSpan, saga: ReadableSpan
) -> ReadableSpan:
    """agent-saga's ``execute_tool charge`` is the only step span, a child of ``framework_span``."""
    stepped = [s for s in spans if "agent_saga.step" in (s.attributes or {})]
    assert [(s.name, _scope(s)) for s in stepped] == [("execute_tool charge", AGENT_SAGA)]
    (own,) = stepped
    assert _parent(own, spans) is framework_span
    assert "agent_saga.step" not in (framework_span.attributes or {}), "not enriched as well"
    _assert_step_attributes(own, saga)
    return own


async def test_openai_agents_tool_span_is_the_step_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    with openinference("openai-agents", provider):
        await _run_charge("openai-agents", wal)
    finished = list(exporter.get_finished_spans())
    saga = _saga(finished)
    # The SDK's function span, made current by the processor: named after the tool,
    # TOOL, with no call id of its own — enriched, and agent-saga makes no span.
    (step,) = _tool_spans(finished, "charge")
    assert step.name == "charge"
    assert _scope(step) == "openinference.instrumentation.openai_agents"
    attrs = _assert_step_attributes(step, saga)
    assert attrs[KIND] == "TOOL"
    assert attrs["tool.name"] == "charge"
    assert str(attrs["gen_ai.tool.call.id"]).startswith("call_"), "the model's call id"
    assert not [s for s in finished if _scope(s) == AGENT_SAGA and s.name.startswith("execute")]
    _assert_no_argument_value(finished)


async def test_crewai_step_span_is_a_child_of_the_task_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    with openinference("crewai", provider):
        await _run_charge("crewai", wal)
    finished = list(exporter.get_finished_spans())
    saga = _saga(finished)
    # CrewAI's instrumentor wraps ``BaseTool.run``/``Tool.run``; its ReAct loop calls the
    # structured tool instead, so there is no tool span: the task's AGENT span is current.
    (step,) = _tool_spans(finished, "charge")
    task = _parent(step, finished)
    assert task is not None
    assert task.name == "support._execute_core"
    assert _scope(task) == "openinference.instrumentation.crewai"
    assert (task.attributes or {})[KIND] == "AGENT"
    assert _assert_own_child_of(finished, task, saga) is step
    _assert_no_argument_value(finished)


async def test_llamaindex_step_span_is_a_child_of_the_tool_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    with openinference("llamaindex", provider):
        await _run_charge("llamaindex", wal)
    finished = list(exporter.get_finished_spans())
    saga = _saga(finished)
    # The dispatcher's span of ``FunctionTool.acall``: TOOL, ``tool.name``, named after
    # the method, not the tool, and without the call id.
    theirs, own = _tool_spans(finished, "charge")
    if _scope(theirs) == AGENT_SAGA:
        theirs, own = own, theirs
    assert theirs.name == "FunctionTool.acall"
    assert _scope(theirs) == "openinference.instrumentation.llama_index"
    assert (theirs.attributes or {})[KIND] == "TOOL"
    assert _assert_own_child_of(finished, theirs, saga) is own
    _assert_no_argument_value(finished)


async def test_autogen_step_span_is_a_child_of_the_tool_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    with openinference("autogen", provider):
        await _run_charge("autogen", wal)
    finished = list(exporter.get_finished_spans())
    saga = _saga(finished)
    # ``{agent}.{tool}``: TOOL, ``tool.name``, named after the agent and the tool.
    theirs, own = _tool_spans(finished, "charge")
    if _scope(theirs) == AGENT_SAGA:
        theirs, own = own, theirs
    assert theirs.name == "support.charge"
    assert _scope(theirs) == "openinference.instrumentation.autogen_agentchat"
    assert (theirs.attributes or {})[KIND] == "TOOL"
    assert _assert_own_child_of(finished, theirs, saga) is own
    # The instrumentor sets the call's arguments as ``tool.parameters`` (the convention's
    # JSON schema of the tool) and TraceConfig does not hide that key: its leak, not ours.
    _assert_no_argument_value(finished, leaks=frozenset({"tool.parameters"}))


async def test_langgraph_step_span_is_a_child_of_the_tool_run_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    with openinference("langgraph", provider):
        await _run_charge("langgraph", wal)
    finished = list(exporter.get_finished_spans())
    saga = _saga(finished)
    # ``charge``: TOOL, kept per run by the LangChain tracer (a callback handler) and
    # never made current by it; the adapter makes it current around the step
    # (``get_span(run_id)``), so the step's span is its child, not its sibling.
    theirs, own = _tool_spans(finished, "charge")
    if _scope(theirs) == AGENT_SAGA:
        theirs, own = own, theirs
    assert theirs.name == "charge"
    assert _scope(theirs) == "openinference.instrumentation.langchain"
    assert (theirs.attributes or {})[KIND] == "TOOL"
    assert _assert_own_child_of(finished, theirs, saga) is own
    assert str((own.attributes or {})["gen_ai.tool.call.id"]).startswith("call_"), "model's id"
    _assert_no_argument_value(finished)
