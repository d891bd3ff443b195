"""OTLP/HTTP export of the same tree to a real receiver, and a scan of everything exported
— spans, events, links, metrics and log lines — for argument values, secrets,
idempotency keys and recovery tokens."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otlp_receiver import OTLPReceiver
from telemetry import Telemetry

from agent_saga import (
    ActionSemantics,
    Compensation,
    Decision,
    GateRefused,
    MaxArgument,
    saga,
    tool,
)
from agent_saga.observability import JsonFormatter, SagaLogFilter, instrument, uninstrument
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R

# A credential the secret scanner knows (built, so that no scanner flags this file).
SECRET = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
CUSTOMER = "cust-zebra-31337"
AMOUNT = 987_123


def _refund(charge_id: str) -> None:
    """The compensation."""


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(fn=_refund, kwargs={"charge_id": r}),
    name="pay",
    no_effect_on=(LookupError,),
)
def pay(amount: int, customer: str) -> str:
    """Pay; fails for a customer that does not exist, quoting the arguments."""
    logging.getLogger("tests.pay").info("paying")
    if customer.endswith("missing"):
        raise LookupError(f"no customer {customer} for {amount} (auth {SECRET})")
    return "ch_1"


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="notify")
def notify(customer: str) -> None:
    """Tell the customer."""


def scenarios() -> list[MemoryLog]:
    """Committed, rolled back with a failed call, refused, approved: every kind of span."""
    logs = [MemoryLog() for _ in range(4)]
    with saga("committed", log=logs[0]):
        pay(amount=AMOUNT, customer=CUSTOMER)
    with pytest.raises(LookupError), saga("rolled-back", log=logs[1]):
        pay(amount=AMOUNT, customer=CUSTOMER)
        pay(amount=AMOUNT, customer=CUSTOMER + "-missing")
    with (
        pytest.raises(GateRefused),
        saga(f"refused {SECRET}", log=logs[2], policies=[MaxArgument("amount", 10)]),
    ):
        pay(amount=AMOUNT, customer=CUSTOMER)
    with saga("approved", log=logs[3], approver=lambda r: Decision.approve("bob", "fine")):
        notify(customer=CUSTOMER)
    return logs


def forbidden(logs: list[MemoryLog]) -> list[str]:
    """What must never be exported: argument values, the secret, keys and tokens."""
    out = [CUSTOMER, str(AMOUNT), f"{AMOUNT:,}", SECRET]
    for log in logs:
        for r in log.records:
            if r["type"] == R.INTENT:
                out.append(r["idempotency_key"])
                out.append(R.recovery_token(r["saga"], r["step"]))
    return out


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SagaLogFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def test_nothing_exported_in_memory_holds_a_value_secret_key_or_token(
    telemetry: Telemetry, logged: io.StringIO
) -> None:
    logs = scenarios()
    exported = "".join(s.to_json() for s in telemetry.spans())
    exported += json.dumps(telemetry.metrics(), default=str)
    lines = logged.getvalue()
    assert lines.count("paying") == 3
    for value in forbidden(logs):
        assert value not in exported, value
        assert value not in lines, value
    assert "[customer]" in exported, "the failed call's message was kept, scrubbed"
    assert "<redacted:" in exported


def test_the_same_tree_arrives_over_otlp_http_without_any_secret(logged: io.StringIO) -> None:
    receiver = OTLPReceiver().start()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(f"{receiver.endpoint}/v1/traces"))
    )
    meter_provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(f"{receiver.endpoint}/v1/metrics"))
        ]
    )
    instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        logs = scenarios()
    finally:
        uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()
        receiver.stop()
    spans = receiver.spans()
    by_id = {s.span_id: s for s in spans}
    tree: dict[str, list[str]] = {}
    for s in spans:
        if s.parent_span_id:
            tree.setdefault(by_id[s.parent_span_id].name, []).append(s.name)
    assert tree == {
        "invoke_workflow saga committed": ["execute_tool pay"],
        "invoke_workflow saga rolled-back": [
            "execute_tool pay",
            "execute_tool pay",
            "compensate pay",
        ],
        "invoke_workflow saga refused <redacted:Stripe secret key>": ["execute_tool pay"],
        "invoke_workflow saga approved": ["execute_tool notify"],
    }
    (comp,) = [s for s in spans if s.name == "compensate pay"]
    (linked,) = comp.links
    assert by_id[linked[1]].attributes["agent_saga.step"] == 1
    assert all(s.kind == 1 for s in spans), "INTERNAL"
    (failed,) = [s for s in spans if s.attributes.get("agent_saga.step.outcome") == "no_effect"]
    assert failed.events[0][0] == "exception"
    assert failed.events[0][1]["exception.type"] == "LookupError"
    assert failed.events[0][1]["agent_saga.step.attempt.outcome"] == "no_effect"
    assert failed.events[0][1]["exception.message"] == (
        "no customer [customer] for [amount] (auth <redacted:Stripe secret key>)"
    )
    points: dict[str, Any] = receiver.metric_points()
    assert sum(v for _, v in points["agent_saga.steps"]) == 5
    everything = b"".join(receiver.bodies).decode("utf-8", "replace")
    for value in forbidden(logs):
        assert value not in everything, value
