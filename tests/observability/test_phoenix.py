"""A real backend: the spans of a committed and of a rolled-back saga, exported over
OTLP/HTTP to Arize Phoenix (started by ``scripts/testenv``), as Phoenix lists them.

Phoenix reads the span kind from ``openinference.span.kind``: the saga must show as a
CHAIN, each step and each compensation as a TOOL, with the parentage that was exported.
Each test writes to a project of its own (resource attribute
``openinference.project.name``), so parallel workers never see each other's spans.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.observability import instrument, uninstrument
from agent_saga.testing import MemoryLog

#: How long Phoenix may take to list what it was sent (it ingests in the background).
LIST_TIMEOUT = 60.0


@pytest.fixture
def phoenix(service: Callable[[str], str]) -> str:
    """Phoenix's base URL (``AGENT_SAGA_TEST_PHOENIX``); skips, or fails under CI, without it."""
    return service("AGENT_SAGA_TEST_PHOENIX").rstrip("/")


class Exported:
    """A tracer provider exporting to Phoenix's project ``project``, and to memory."""

    def __init__(self, base_url: str) -> None:
        self.project = f"agent-saga-test-{uuid.uuid4().hex[:12]}"
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=Resource.create(
                {"service.name": "agent-saga-tests", "openinference.project.name": self.project}
            )
        )
        otlp = OTLPSpanExporter(endpoint=f"{base_url}/v1/traces", timeout=10)
        self.provider.add_span_processor(SimpleSpanProcessor(otlp))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))

    def spans(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())


@pytest.fixture
def exported(phoenix: str) -> Iterator[Exported]:
    """``instrument()`` with an SDK that exports over OTLP/HTTP to Phoenix."""
    out = Exported(phoenix)
    instrument(tracer_provider=out.provider)
    try:
        yield out
    finally:
        uninstrument()
        out.provider.shutdown()


def listed_spans(base_url: str, project: str, count: int) -> list[dict[str, Any]]:
    """Phoenix's ``GET /v1/projects/{project}/spans``, polled until it lists ``count``
    spans (the project exists once its first span is stored: 404 until then)."""
    url = f"{base_url}/v1/projects/{urllib.parse.quote(project)}/spans?limit=1000"
    deadline = time.monotonic() + LIST_TIMEOUT
    spans: list[dict[str, Any]] = []
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                spans = json.load(r)["data"]
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        if len(spans) >= count or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def _hex_ids(span: ReadableSpan) -> tuple[str, str, str | None]:
    assert span.context is not None
    parent = None if span.parent is None else f"{span.parent.span_id:016x}"
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}", parent


def test_phoenix_lists_the_sagas_with_chain_and_tool_kinds_and_the_exported_parentage(
    phoenix: str, exported: Exported
) -> None:
    undone: list[str] = []

    def refund(charge_id: str) -> None:
        undone.append(charge_id)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=refund, kwargs={"charge_id": r}),
        name="phoenix_charge",
    )
    def charge(amount: int, customer: str) -> str:
        """Charge a customer."""
        return f"ch_{customer}"

    with saga("phoenix-checkout", log=MemoryLog()):
        charge(amount=42, customer="c")
    with (
        pytest.raises(RuntimeError, match="model crashed"),
        saga("phoenix-refunds", log=MemoryLog()),
    ):
        charge(amount=1, customer="a")
        charge(amount=2, customer="b")
        raise RuntimeError("the model crashed")
    assert undone == ["ch_b", "ch_a"]
    assert exported.provider.force_flush(timeout_millis=10_000)

    sent = exported.spans()
    assert sorted(s.name for s in sent) == [
        "compensate phoenix_charge",
        "compensate phoenix_charge",
        "execute_tool phoenix_charge",
        "execute_tool phoenix_charge",
        "execute_tool phoenix_charge",
        "invoke_workflow saga phoenix-checkout",
        "invoke_workflow saga phoenix-refunds",
    ]
    listed = listed_spans(phoenix, exported.project, len(sent))

    # Phoenix lists exactly what was exported: names, ids, parents and kinds.
    def kind(name: str) -> str:
        return "CHAIN" if name.startswith("invoke_workflow saga ") else "TOOL"

    expected = sorted((*_hex_ids(s), s.name, kind(s.name)) for s in sent)
    got = sorted(
        (
            p["context"]["trace_id"],
            p["context"]["span_id"],
            p["parent_id"],
            p["name"],
            p["span_kind"],
        )
        for p in listed
    )
    assert got == expected

    # The tree, read from Phoenix alone: each saga is a root CHAIN; its steps and
    # compensations are TOOL children in its trace.
    by_id = {p["context"]["span_id"]: p for p in listed}
    sagas = {p["name"]: p for p in listed if p["span_kind"] == "CHAIN"}
    assert sorted(sagas) == [
        "invoke_workflow saga phoenix-checkout",
        "invoke_workflow saga phoenix-refunds",
    ]
    for p in listed:
        if p["span_kind"] == "TOOL":
            parent = by_id[p["parent_id"]]
            assert parent["span_kind"] == "CHAIN"
            assert parent["context"]["trace_id"] == p["context"]["trace_id"]
        else:
            assert p["parent_id"] is None
    checkout = sagas["invoke_workflow saga phoenix-checkout"]
    refunds = sagas["invoke_workflow saga phoenix-refunds"]
    assert checkout["status_code"] != "ERROR"
    assert refunds["status_code"] == "ERROR"
    assert refunds["attributes"]["agent_saga.saga.outcome"] == "rolled_back"
    children = sorted(p["name"] for p in listed if p["parent_id"] == refunds["context"]["span_id"])
    assert children == [
        "compensate phoenix_charge",
        "compensate phoenix_charge",
        "execute_tool phoenix_charge",
        "execute_tool phoenix_charge",
    ]
    for p in listed:
        if p["name"] == "compensate phoenix_charge":
            assert p["attributes"]["agent_saga.compensation.outcome"] == "compensated"
