"""Inside the frameworks' real agent loops (scripted models): the step's span is the
framework's own ``execute_tool`` span, enriched — never a duplicate beside it.

Neither framework speaks OpenTelemetry by itself; their instrumentations do, through
the hooks the frameworks offer: a trace processor of the Agents SDK (what OpenInference
and Logfire install) and a LangChain callback handler. The bridges below are those
instrumentations reduced to the tool span: ``execute_tool {tool}``, current while the
framework runs the tool, with the model's call id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from adapter_handlers import COMPENSABLE, charge, compensate_charge
from drivers import driver
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from scripted import Call

from agent_saga.observability import instrument, uninstrument


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


def _tool_span_attributes(name: str, call_id: str | None) -> dict[str, Any]:
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    return attributes


def _only_tool_span(exporter: InMemorySpanExporter, tool: str) -> ReadableSpan:
    spans = exporter.get_finished_spans()
    tool_spans = [s for s in spans if s.attributes and s.attributes.get("gen_ai.tool.name") == tool]
    assert len(tool_spans) == 1, [(s.name, s.instrumentation_scope) for s in spans]
    return tool_spans[0]


def _assert_enriched(span: ReadableSpan, saga_span: ReadableSpan) -> None:
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "framework-bridge", "the framework's own span"
    attrs = dict(span.attributes or {})
    assert attrs["agent_saga.step"] == 1
    assert attrs["agent_saga.step.semantics"] == "compensable"
    assert attrs["agent_saga.step.outcome"] == "committed"
    assert attrs["agent_saga.saga.id"] == saga_span.attributes["agent_saga.saga.id"]  # type: ignore[index]
    # The model's call id: the framework's when its span has one, else the adapter's.
    assert str(attrs["gen_ai.tool.call.id"]).startswith("call_")
    assert span.context is not None
    assert saga_span.context is not None
    assert span.context.trace_id == saga_span.context.trace_id


async def test_openai_agents_function_span_is_the_step_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    from agents import set_trace_processors, set_tracing_disabled
    from agents.tracing import TracingProcessor
    from agents.tracing.span_data import FunctionSpanData

    exporter, provider = spans
    tracer = provider.get_tracer("framework-bridge")

    class Bridge(TracingProcessor):
        """The SDK's function spans as OpenTelemetry ``execute_tool`` spans, made current."""

        def __init__(self) -> None:
            self.open: dict[str, tuple[Any, object]] = {}

        def on_trace_start(self, t: Any) -> None: ...
        def on_trace_end(self, t: Any) -> None: ...

        def on_span_start(self, span: Any) -> None:
            data = span.span_data
            if isinstance(data, FunctionSpanData):
                otel_span = tracer.start_span(
                    f"execute_tool {data.name}", attributes=_tool_span_attributes(data.name, None)
                )
                token = otel_context.attach(trace.set_span_in_context(otel_span))
                self.open[span.span_id] = (otel_span, token)

        def on_span_end(self, span: Any) -> None:
            opened = self.open.pop(span.span_id, None)
            if opened is not None:
                otel_context.detach(opened[1])
                opened[0].end()

        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    fw = driver("openai-agents")
    tool = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    set_trace_processors([Bridge()])
    set_tracing_disabled(False)
    try:
        await fw.run(
            fw.target([tool], [[Call("charge", {"charge_id": "ch_1"})], "done"]), wal_path=wal
        )
    finally:
        set_tracing_disabled(True)
        set_trace_processors([])
    saga_span = next(
        s for s in exporter.get_finished_spans() if s.name.startswith("invoke_workflow saga")
    )
    step = _only_tool_span(exporter, "charge")
    assert step.name == "execute_tool charge"
    _assert_enriched(step, saga_span)


async def test_langgraph_tool_run_span_is_the_step_span(
    wal: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    exporter, provider = spans
    tracer = provider.get_tracer("framework-bridge")

    class Bridge(BaseCallbackHandler):
        """LangChain tool runs as OpenTelemetry ``execute_tool`` spans, made current."""

        run_inline = True

        def __init__(self) -> None:
            self.open: dict[Any, tuple[Any, object]] = {}

        def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any, **kw: Any) -> None:
            name = (serialized or {}).get("name") or kw.get("name")
            call_id = (kw.get("inputs") or {}).get("tool_call_id") or kw.get("tool_call_id")
            span = tracer.start_span(
                f"execute_tool {name}", attributes=_tool_span_attributes(name, call_id)
            )
            self.open[run_id] = (span, otel_context.attach(trace.set_span_in_context(span)))

        def _end(self, run_id: Any) -> None:
            opened = self.open.pop(run_id, None)
            if opened is not None:
                otel_context.detach(opened[1])
                opened[0].end()

        def on_tool_end(self, output: Any, *, run_id: Any, **kw: Any) -> None:
            self._end(run_id)

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._end(run_id)

    fw = driver("langgraph")
    tool = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    await fw.adapter.saga_run(
        fw.target([tool], [[Call("charge", {"charge_id": "ch_1"})], "done"]),
        fw.input(),
        wal_path=wal,
        run_options={"config": {"callbacks": [Bridge()]}},
    )
    saga_span = next(
        s for s in exporter.get_finished_spans() if s.name.startswith("invoke_workflow saga")
    )
    step = _only_tool_span(exporter, "charge")
    assert step.name == "execute_tool charge"
    _assert_enriched(step, saga_span)
