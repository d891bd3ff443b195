"""SagaLogFilter puts the saga and the step on records; JsonFormatter writes JSON lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from telemetry import Telemetry

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.observability import JsonFormatter, SagaLogFilter
from agent_saga.testing import MemoryLog

log = logging.getLogger("tests.observability.tool")


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=lambda: None))
def ship(parcel: str) -> str:
    """Ship a parcel, saying so."""
    log.info("shipping")
    return parcel


@tool(semantics=ActionSemantics.REVERSIBLE)
def tag(parcel: str) -> str:
    """Tag a parcel in memory."""
    log.info("tagging")
    return parcel


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SagaLogFilter())
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        log.removeHandler(handler)


def _read(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_records_inside_a_saga_carry_its_id_name_and_the_running_step(
    lines: io.StringIO,
) -> None:
    log.info("before")
    with saga("shipping", log=MemoryLog()) as s:
        log.info("inside")
        ship("p1")
        tag("p2")
    out = _read(lines)
    assert [o["message"] for o in out] == ["before", "inside", "shipping", "tagging"]
    assert "saga_id" not in out[0]
    assert "step" not in out[0]
    assert (out[1]["saga_id"], out[1]["saga_name"], out[1].get("step")) == (s.id, "shipping", None)
    assert (out[2]["saga_id"], out[2]["step"]) == (s.id, 1)
    assert (out[3]["saga_id"], out[3]["step"]) == (s.id, 2)
    assert out[2]["level"] == "INFO"
    assert out[2]["logger"] == "tests.observability.tool"
    assert str(out[2]["ts"]).endswith("Z")


def test_traced_records_carry_the_current_trace_and_span_ids(
    telemetry: Telemetry, lines: io.StringIO
) -> None:
    with saga("traced", log=MemoryLog()):
        ship("p1")
    (line,) = [o for o in _read(lines) if o["message"] == "shipping"]
    step = telemetry.named("execute_tool ship")
    assert step.context is not None
    assert line["trace_id"] == f"{step.context.trace_id:032x}"
    assert line["span_id"] == f"{step.context.span_id:016x}"


def test_a_credential_in_a_log_line_is_redacted(lines: io.StringIO) -> None:
    token = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    log.info("pushing with %s", token)
    (line,) = _read(lines)
    assert token not in json.dumps(line)
    assert "<redacted:" in str(line["message"])


def test_the_librarys_own_escalation_warning_names_its_saga(lines: io.StringIO) -> None:
    lib = logging.getLogger("agent_saga")
    handler = log.handlers[0]
    lib.addHandler(handler)
    try:

        def broken() -> None:
            raise RuntimeError("refund service down")

        @tool(semantics=ActionSemantics.REVERSIBLE, compensate=lambda r: Compensation(fn=broken))
        def flaky(x: int) -> int:
            return x

        with pytest.raises(Exception, match="could not undo"), saga("esc", log=MemoryLog()) as s:
            flaky(1)
            raise ValueError("fail")
    finally:
        lib.removeHandler(handler)
    (warning,) = [o for o in _read(lines) if o["level"] == "WARNING"]
    assert warning["saga_id"] == s.id
    assert warning["saga_name"] == "esc"
