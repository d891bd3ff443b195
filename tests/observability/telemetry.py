"""What the observability tests read back: the in-memory spans and metrics of an SDK."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@dataclass
class Telemetry:
    """What the instrumented code exported, in memory."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, (name, [s.name for s in self.spans()])
        return found[0]

    def metrics(self) -> dict[str, list[tuple[dict[str, object], float]]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[tuple[dict[str, object], float]]] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        out.setdefault(m.name, []).append((dict(p.attributes or {}), p.value))
        return out
