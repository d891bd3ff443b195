"""An OpenTelemetry SDK set up from the standard ``OTEL_*`` variables (``saga-recoveryd --otel``).

A library leaves the SDK to the application; ``saga-recoveryd`` *is* the
application, so ``--otel`` sets one up: a tracer provider with a batch processor and
a meter provider with a periodic reader, both exporting OTLP over HTTP/protobuf to
where ``OTEL_EXPORTER_OTLP_ENDPOINT`` (and its per-signal variants, headers,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` ...) point — the SDK reads them.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import MissingExtra, install_hint
from . import instrument

__all__ = ["instrument_from_environment"]

_PACKAGES = "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"


def instrument_from_environment(service_name: str) -> Callable[[], None]:
    """Install global SDK providers exporting OTLP/HTTP, then :func:`instrument`.

    Args:
        service_name: ``service.name`` when ``OTEL_SERVICE_NAME`` does not set one.

    Returns:
        The shutdown: flushes what is buffered and stops the exporters.

    Raises:
        MissingExtra: the SDK or the OTLP/HTTP exporter is not installed.
    """
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise MissingExtra(
            f"--otel needs the 'otel' extra and an SDK: {install_hint('otel')} "
            f"{_PACKAGES} (could not import {exc.name or exc})",
            extra="otel",
            package=_PACKAGES,
        ) from exc
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    instrument(tracer_provider, meter_provider)

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown
