"""A real OTLP/HTTP receiver for the tests: decodes the protobuf requests it is sent.

``OTLPReceiver`` runs a standard-library HTTP server on 127.0.0.1 in a thread and
keeps every ``/v1/traces`` and ``/v1/metrics`` request, decoded with
``opentelemetry-proto``, plus the raw bodies (for the secret scan).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


@dataclass(frozen=True)
class Span:
    """One received span, flattened for assertions."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]
    status_code: int
    service: str | None


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class OTLPReceiver:
    """Collects what exporters send; ``endpoint`` is the base URL to give them."""

    bodies: list[bytes] = field(default_factory=list)
    traces: list[Any] = field(default_factory=list)
    metrics: list[Any] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> OTLPReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.bodies.append(body)
                if self.path.endswith("/v1/traces"):
                    req = trace_service_pb2.ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    receiver.traces.append(req)
                    reply = trace_service_pb2.ExportTraceServiceResponse()
                elif self.path.endswith("/v1/metrics"):
                    req = metrics_service_pb2.ExportMetricsServiceRequest()
                    req.ParseFromString(body)
                    receiver.metrics.append(req)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def spans(self) -> list[Span]:
        """Every span received so far, in arrival order."""
        return list(self._spans())

    def _spans(self) -> Iterator[Span]:
        for req in self.traces:
            for rs in req.resource_spans:
                service = _attrs(rs.resource.attributes).get("service.name")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        yield Span(
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes=_attrs(s.attributes),
                            events=[(e.name, _attrs(e.attributes)) for e in s.events],
                            links=[
                                (ln.trace_id.hex(), ln.span_id.hex(), _attrs(ln.attributes))
                                for ln in s.links
                            ],
                            status_code=s.status.code,
                            service=service,
                        )

    def metric_points(self) -> dict[str, list[tuple[dict[str, Any], float]]]:
        """Metric name -> (attributes, value) of each point of the last export.

        Metrics are cumulative: the last export holds the totals.
        """
        out: dict[str, list[tuple[dict[str, Any], float]]] = {}
        for req in self.metrics[-1:]:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            value = (
                                p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            )
                            out.setdefault(m.name, []).append((_attrs(p.attributes), value))
        return out
