"""Saga ids on log records, and JSON log lines: ``SagaLogFilter`` and ``JsonFormatter``.

Standard library only (no OpenTelemetry needed)::

    handler = logging.StreamHandler()
    handler.addFilter(SagaLogFilter())        # saga_id, saga_name, step on every record
    handler.setFormatter(JsonFormatter())     # one JSON object per line

Records emitted inside a saga — by the agent, a tool, a library it calls, or
agent-saga itself — then carry the saga's id and name and the running step's
number; with ``instrument()`` also the current ``trace_id`` and ``span_id``, so a log
line leads to its trace. agent-saga's own records pass the saga explicitly where the
saga block was already left (an escalation reported at the end of a saga).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any, Final

from .._runtime import current_saga
from ..secrets import redact
from ._observer import current_step, install, installed

__all__ = ["JsonFormatter", "SagaLogFilter"]

_FIELDS: Final = ("saga_id", "saga_name", "step", "trace_id", "span_id")


def _trace_ids() -> tuple[str, str] | None:
    """The current span's ids as hex, when ``instrument()`` is active and a span is."""
    obs = installed()
    if obs is None or obs.otel is None:
        return None
    from opentelemetry import trace  # imported already: instrument() did

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


class SagaLogFilter(logging.Filter):
    """Puts ``saga_id``, ``saga_name`` and ``step`` on every record emitted inside a saga.

    Outside a saga they are None. Fields a record already carries (passed with
    ``extra=``) are kept. With ``instrument()`` active, ``trace_id`` and ``span_id``
    are added too. Add it to a handler (``handler.addFilter(SagaLogFilter())``), not
    to a logger, so that records of every logger pass through it.

    Making one installs agent-saga's observer, so that steps are numbered for the
    records: a few hundred nanoseconds per step, and nothing else.
    """

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        install(for_logs=True)

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the fields; never drops a record."""
        if getattr(record, "saga_id", None) is None:
            scope = current_saga()
            record.saga_id = None if scope is None else scope.id
            if getattr(record, "saga_name", None) is None:
                record.saga_name = None if scope is None else scope.name
        elif not hasattr(record, "saga_name"):
            record.saga_name = None
        if getattr(record, "step", None) is None:
            record.step = current_step()
        if getattr(record, "trace_id", None) is None:
            ids = _trace_ids()
            record.trace_id, record.span_id = ids if ids is not None else (None, None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, saga fields, exception.

    ``ts`` is UTC ISO 8601 with milliseconds. The saga fields are those
    :class:`SagaLogFilter` sets (left out when None). The message and the exception
    text pass the secret scanner first: a credential in a log line is redacted.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as a JSON line (no trailing newline)."""
        ts = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for key in _FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exception"] = redact(record.exc_text)
        if record.stack_info:
            out["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(out, ensure_ascii=False, default=str)
