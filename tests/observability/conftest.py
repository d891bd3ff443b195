"""Fixtures of the observability tests: an SDK with in-memory exporters, instrumented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from telemetry import Telemetry

from agent_saga.observability import instrument, uninstrument


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """``instrument()`` with an SDK whose spans and metrics stay in memory."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Telemetry(exporter, reader, tracer_provider)
    finally:
        uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()
