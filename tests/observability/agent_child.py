"""An instrumented agent that dies: exports its spans over OTLP/HTTP, then is SIGKILLed.

argv: WAL path, OTLP endpoint (base URL), customer. Two steps commit; the process
is killed right after the second one, inside its saga.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otel_handlers import reserve

from agent_saga import saga
from agent_saga.observability import instrument
from agent_saga.testing import arm_crash


def main() -> None:
    wal, endpoint, customer = sys.argv[1:4]
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{endpoint}/v1/traces")))
    instrument(tracer_provider=provider)
    arm_crash("step.after_commit", skip=1)
    with saga("order-42", wal_path=wal, lease_seconds=0.5):
        reserve(item="a", customer=customer)
        reserve(item="b", customer=customer)


if __name__ == "__main__":
    main()
