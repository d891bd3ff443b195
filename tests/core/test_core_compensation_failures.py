"""Failing compensations and failing compensation factories: the rest still unwinds.

A compensation that fails past its retry budget is escalated, the others still run,
and ``CompensationFailed`` (cause: the original exception) tells the caller. A factory
that raises or returns something else raises ``InvalidCompensation`` at the call site
and the forward effect, which did happen, is escalated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    CompensationFailed,
    InvalidCompensation,
    RetryPolicy,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R

NO_WAIT = RetryPolicy(attempts=3, initial_delay=0)


class AgentError(Exception):
    pass


def compensable(undone: list[str], label: str, undo: Any = None) -> Any:
    def default_undo() -> None:
        undone.append(label)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=undo or default_undo),
        name=label,
    )
    def step() -> str:
        return label

    return step


@pytest.mark.parametrize("use_async", [False, True])
def test_one_failing_compensation_does_not_stop_the_others(use_async: bool) -> None:
    undone: list[str] = []
    attempts: list[int] = []
    refund_error = ConnectionError("refund API down")

    def broken_refund() -> None:
        attempts.append(1)
        raise refund_error

    a, b, c = (
        compensable(undone, "a"),
        compensable(undone, "b", broken_refund),
        compensable(undone, "c"),
    )
    log = MemoryLog()
    error = AgentError("boom")

    if use_async:

        async def agent() -> None:
            async with saga(log=log, compensation_retry=NO_WAIT):
                await a()
                await b()
                await c()
                raise error

        with pytest.raises(CompensationFailed) as caught:
            asyncio.run(agent())
    else:
        with pytest.raises(CompensationFailed) as caught:
            with saga(log=log, compensation_retry=NO_WAIT):
                a()
                b()
                c()
                raise error

    assert undone == ["c", "a"]
    assert len(attempts) == 3, "the failing compensation used its whole retry budget"
    failure = caught.value
    assert failure.__cause__ is error
    assert [(sid, name) for sid, name, _ in failure.failures] == [(2, "b")]
    assert failure.failures[0][2] is refund_error
    assert failure.saga_id == log.of_type(R.SAGA_BEGIN)[0]["saga"]
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 2
    assert "retry budget" in escalated["reason"]
    assert [r["final"] for r in log.of_type(R.COMPENSATION_FAILED)] == [False, False, True]
    assert [r["step"] for r in log.of_type(R.COMPENSATED)] == [3, 1]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["escalated"]


def test_compensation_that_recovers_within_its_retry_budget_is_not_escalated() -> None:
    undone: list[str] = []
    calls: list[int] = []

    def flaky_refund() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("try again")
        undone.append("charge")

    charge = compensable(undone, "charge", flaky_refund)
    log = MemoryLog()
    error = AgentError()

    with pytest.raises(AgentError) as caught:
        with saga(log=log, compensation_retry=RetryPolicy(attempts=3, initial_delay=0)):
            charge()
            raise error

    assert caught.value is error
    assert len(calls) == 3
    assert undone == ["charge"]
    assert log.of_type(R.ESCALATED) == []
    assert [r["attempt"] for r in log.of_type(R.COMPENSATION_FAILED)] == [1, 2]
    assert len(log.of_type(R.COMPENSATED)) == 1
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


def test_compensation_naming_an_unregistered_handler_is_escalated() -> None:
    undone: list[str] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="tests.core.nobody.registered.this"),
    )
    def charge() -> None:
        return None

    other = compensable(undone, "other")
    log = MemoryLog()

    with pytest.raises(CompensationFailed):
        with saga(log=log, compensation_retry=NO_WAIT):
            other()
            charge()
            raise AgentError

    assert undone == ["other"]
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 2
    assert "handler not registered" in escalated["reason"]


@pytest.mark.parametrize(
    "factory",
    [
        lambda r: 1 / 0,
        lambda r: None,
        lambda r: {"fn": print},
        lambda r: Compensation(fn=lambda **kw: None, kwargs={"when": object()}),
    ],
    ids=["raises", "returns-None", "returns-dict", "kwargs-not-json"],
)
def test_invalid_factory_raises_at_the_call_and_escalates_the_forward_effect(factory: Any) -> None:
    undone: list[str] = []
    calls: list[str] = []
    before, after = compensable(undone, "before"), compensable(undone, "after")

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=factory, name="charge")
    def charge() -> str:
        calls.append("charge")
        return "ch_1"

    log = MemoryLog()
    raised_at_call: list[InvalidCompensation] = []

    with pytest.raises(CompensationFailed) as caught:
        with saga(log=log, compensation_retry=NO_WAIT):
            before()
            try:
                charge()
            except InvalidCompensation as exc:
                raised_at_call.append(exc)
                after()
                raise

    assert calls == ["charge"], "the forward call happened"
    [invalid] = raised_at_call
    assert invalid.step_id == 2
    assert caught.value.__cause__ is invalid
    assert undone == ["after", "before"]
    [committed] = [r for r in log.of_type(R.COMMITTED) if r["step"] == 2]
    assert committed["handler"] is None
    assert "invalid" in committed
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 2


def test_invalid_factory_step_is_escalated_even_when_the_agent_handles_the_error() -> None:
    """The agent caught InvalidCompensation and went on; later the saga fails.

    The step's effect landed and nothing can undo it: it must be escalated.
    """

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: None)
    def charge() -> str:
        return "ch_1"

    log = MemoryLog()
    with pytest.raises(CompensationFailed):
        with saga(log=log):
            with pytest.raises(InvalidCompensation):
                charge()
            raise AgentError

    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [1]


@pytest.mark.parametrize(
    "factory", [lambda r: 1 / 0, lambda r: "not a compensation"], ids=["raises", "returns-str"]
)
def test_reversible_tool_whose_factory_failed_is_not_silently_dropped_on_rollback(
    factory: Any,
) -> None:
    """A REVERSIBLE tool with ``compensate=``: its factory fails, the agent goes on, the
    saga fails. The effect happened and nothing will undo it: fail closed — escalate it
    and tell the caller (CompensationFailed), as the durable path does.
    """
    calls: list[str] = []

    @tool(semantics=ActionSemantics.REVERSIBLE, compensate=factory)
    def cache_put() -> str:
        calls.append("put")
        return "k"

    log = MemoryLog()
    with pytest.raises(CompensationFailed):
        with saga(log=log):
            with pytest.raises(InvalidCompensation):
                cache_put()
            raise AgentError

    assert calls == ["put"]
    assert len(log.of_type(R.ESCALATED)) == 1


def test_failing_restore_of_a_reversible_step_is_escalated() -> None:
    def broken_restore() -> None:
        raise OSError("cache gone")

    @tool(semantics=ActionSemantics.REVERSIBLE, snapshot=lambda: broken_restore)
    def cache_put() -> None:
        return None

    log = MemoryLog()
    error = AgentError()
    with pytest.raises(CompensationFailed) as caught:
        with saga(log=log, compensation_retry=NO_WAIT):
            cache_put()
            raise error

    assert caught.value.__cause__ is error
    assert "restore" in log.of_type(R.ESCALATED)[0]["reason"]


def test_completed_irreversible_step_in_a_failed_saga_is_escalated_for_the_record() -> None:
    undone: list[str] = []
    before = compensable(undone, "before")

    @tool(semantics=ActionSemantics.IRREVERSIBLE)
    def send_email() -> None:
        return None

    log = MemoryLog()
    error = AgentError()
    with pytest.raises(AgentError) as caught:
        with saga(log=log, approver=lambda request: True):
            before()
            send_email()
            raise error

    assert caught.value is error
    assert undone == ["before"]
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 2
    assert "IRREVERSIBLE" in escalated["reason"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["escalated"]


def test_escalations_are_logged_even_when_the_saga_commits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A saga can commit with an escalation (an unknown outcome nobody can resolve);
    ``@saga`` callers see no exception, so the escalation is logged once."""
    log = MemoryLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: None),
        name="flaky",
    )
    def flaky() -> None:
        raise TimeoutError("gateway timeout")

    @saga(log=log)
    def agent() -> None:
        with contextlib.suppress(TimeoutError):
            flaky()

    with caplog.at_level(logging.WARNING, logger="agent_saga"):
        agent()
    escalated = [r for r in caplog.records if "escalated to a human" in r.getMessage()]
    assert len(escalated) == 1
    assert "outcome unknown" in escalated[0].getMessage()
    assert log.of_type("saga_end")[0]["outcome"] == "escalated"
