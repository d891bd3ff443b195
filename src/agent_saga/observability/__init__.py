"""Sagas, steps, compensations, gate decisions and recoveries as OpenTelemetry traces.

::

    from agent_saga.observability import instrument

    instrument()                      # the global tracer and meter providers
    instrument(tracer_provider=tp)    # or your own

The saga is an ``invoke_workflow saga {name}`` span, each durable step an
``execute_tool {tool}`` span (or the framework's own, enriched), each compensation a
span linked to the step it undoes, each gate decision a ``gen_ai.guardrail.result``
event, and a recovery by ``saga-recoveryd`` a new trace linked to the saga's — with
the attributes Phoenix, LangSmith and Langfuse read to show the right kinds.
``docs/observability.md`` draws the tree and shows each backend's setup.

Nothing is imported from OpenTelemetry until :func:`instrument` is called (extra
``otel``); before that, and after :func:`uninstrument`, the engine calls nothing.
:class:`SagaLogFilter` and :class:`JsonFormatter` need only the standard library.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Final

from ..errors import MissingExtra, install_hint
from . import _observer
from .logs import JsonFormatter, SagaLogFilter

__all__ = ["JsonFormatter", "SagaLogFilter", "instrument", "instrumented", "uninstrument"]

_LOCK: Final = threading.Lock()


def instrument(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Trace and measure every saga of this process through OpenTelemetry.

    Idempotent: a second call changes nothing (call :func:`uninstrument` first to
    switch providers). Sagas already running when it is called are not traced.

    Args:
        tracer_provider: An OpenTelemetry ``TracerProvider``; None uses the global
            one (``opentelemetry.trace.set_tracer_provider``), also when it is set
            later.
        meter_provider: An OpenTelemetry ``MeterProvider``; None uses the global one.

    Raises:
        MissingExtra: ``opentelemetry-api`` is not installed (extra ``otel``).
    """
    try:
        importlib.import_module("opentelemetry.trace")
        importlib.import_module("opentelemetry.metrics")
    except ImportError as exc:
        raise MissingExtra(
            "agent_saga.observability.instrument() needs the 'otel' extra: "
            f"{install_hint('otel')} (could not import opentelemetry: {exc})",
            extra="otel",
            package="opentelemetry-api",
        ) from exc
    from ._otel import Otel

    with _LOCK:
        observer = _observer.install()
        if observer.otel is None:
            observer.counts = _observer.Counts()  # metrics start from zero with new providers
            observer.gauges = {}
            observer.otel = Otel(observer, tracer_provider, meter_provider)


def uninstrument() -> None:
    """Stop tracing: sagas that start afterwards produce no span, event or metric."""
    with _LOCK:
        _observer.uninstall()


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    observer = _observer.installed()
    return observer is not None and observer.otel is not None
