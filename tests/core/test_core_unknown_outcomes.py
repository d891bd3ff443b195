"""Forward calls that raised: no effect, unknown outcome, resolvers, retries, idempotency.

An exception listed in ``no_effect_on`` proves the call did not land. Any other leaves
the outcome UNKNOWN: a resolver decides, or the step is escalated (SPEC §10.6: never
forgotten). Retries log every attempt and share one idempotency key; compensations get
the deterministic recovery token.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    CompensationFailed,
    Resolution,
    RetryPolicy,
    register_handler,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R

NO_WAIT = RetryPolicy(attempts=3, initial_delay=0)


class AgentError(Exception):
    pass


class Declined(ValueError):
    pass


def outcome_of_saga(log: MemoryLog) -> list[str]:
    return [r["outcome"] for r in log.of_type(R.SAGA_END)]


# --- no effect vs unknown --------------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
def test_exception_declared_no_effect_needs_no_compensation(use_async: bool) -> None:
    undone: list[str] = []
    error = Declined("card declined")

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("charge")),
        no_effect_on=(ValueError,),
    )
    def charge() -> None:
        raise error

    log = MemoryLog()
    if use_async:

        async def agent() -> None:
            async with saga(log=log):
                await charge()

        with pytest.raises(Declined) as caught:
            asyncio.run(agent())
    else:
        with pytest.raises(Declined) as caught:
            with saga(log=log):
                charge()

    assert caught.value is error
    assert undone == []
    [failed] = log.of_type(R.FORWARD_FAILED)
    assert (failed["outcome"], failed["attempt"]) == ("no_effect", 1)
    assert "card declined" in failed["error"]
    assert log.of_type(R.ESCALATED) == []
    assert outcome_of_saga(log) == ["rolled_back"]


def test_exception_not_declared_no_effect_leaves_the_outcome_unknown() -> None:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: None),
        no_effect_on=(ValueError,),
    )
    def charge() -> None:
        raise TimeoutError("read timed out")

    log = MemoryLog()
    with pytest.raises(CompensationFailed):
        with saga(log=log):
            charge()

    [failed] = log.of_type(R.FORWARD_FAILED)
    assert failed["outcome"] == "unknown"
    [escalated] = log.of_type(R.ESCALATED)
    assert "outcome unknown" in escalated["reason"]


# --- resolvers -------------------------------------------------------------------------


class ResolverCase:
    """A tool of unknown outcome with a resolver registered under a fresh name."""

    def __init__(self, name: str, verdict: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self.forward_error = TimeoutError("gateway timeout")
        self.name = f"tests.core.resolver.{name}"

        def resolver(**kwargs: Any) -> Any:
            self.calls.append(kwargs)
            if isinstance(verdict, BaseException):
                raise verdict
            return verdict

        register_handler(self.name, resolver)

        @tool(
            semantics=ActionSemantics.COMPENSABLE,
            compensate=lambda r: Compensation(fn=lambda: None),
            resolver=self.name,
            name="charge",
        )
        def charge(customer: str, amount: int) -> None:
            raise self.forward_error

        self.charge = charge


def test_resolver_saying_no_effect_settles_the_step_without_compensation() -> None:
    case = ResolverCase("no_effect", Resolution.no_effect("no charge found"))
    log = MemoryLog()

    with pytest.raises(TimeoutError) as caught:
        with saga(log=log) as s:
            case.charge("cus_1", amount=42)

    assert caught.value is case.forward_error
    [call] = case.calls
    assert call == {
        "tool": "charge",
        "kwargs": {"customer": "cus_1", "amount": 42},
        "preimage": None,
        "idempotency_key": R.idempotency_key(s.id, 1),
    }
    [settled] = log.of_type(R.COMPENSATED)
    assert settled["outcome"] == "no_effect"
    assert settled["token"] == R.recovery_token(s.id, 1)
    assert log.of_type(R.ESCALATED) == []
    assert outcome_of_saga(log) == ["rolled_back"]


def test_resolver_saying_landed_runs_the_compensation_it_returns() -> None:
    refunds: list[dict[str, Any]] = []

    def refund(charge_id: str, idempotency_key: str) -> None:
        refunds.append({"charge_id": charge_id, "key": idempotency_key})

    case = ResolverCase(
        "landed", Resolution.landed(Compensation(fn=refund, kwargs={"charge_id": "ch_9"}))
    )
    log = MemoryLog()

    with pytest.raises(TimeoutError) as caught:
        with saga(log=log) as s:
            case.charge("cus_1", amount=42)

    assert caught.value is case.forward_error
    assert refunds == [{"charge_id": "ch_9", "key": R.recovery_token(s.id, 1)}]
    assert [r["step"] for r in log.of_type(R.COMPENSATED)] == [1]
    assert log.of_type(R.ESCALATED) == []
    assert outcome_of_saga(log) == ["rolled_back"]


@pytest.mark.parametrize(
    ("verdict", "reason_part"),
    [
        (Resolution.undecided("the gateway keeps no history"), "the gateway keeps no history"),
        ("landed", "Resolution"),
        (RuntimeError("resolver crashed"), "resolver crashed"),
    ],
    ids=["undecided", "not-a-resolution", "raises"],
)
def test_resolver_that_cannot_decide_escalates_the_step(verdict: Any, reason_part: str) -> None:
    case = ResolverCase("undecided", verdict)
    log = MemoryLog()

    with pytest.raises(CompensationFailed) as caught:
        with saga(log=log):
            case.charge("cus_1", amount=42)

    assert caught.value.__cause__ is case.forward_error
    assert len(case.calls) == 1
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 1
    assert reason_part in escalated["reason"]
    assert outcome_of_saga(log) == ["escalated"]


def test_declared_resolver_that_is_not_registered_is_refused_or_escalated() -> None:
    calls: list[int] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: None),
        resolver="tests.core.resolver.never_registered",
    )
    def charge() -> None:
        calls.append(1)
        raise TimeoutError

    log = MemoryLog()
    with pytest.raises(Exception):
        with saga(log=log):
            charge()

    escalations = log.of_type(R.ESCALATED)
    refusals = [r for r in log.of_type(R.GATE) if r["decision"] == "refused"]
    assert escalations or refusals
    if escalations:
        assert "handler not registered" in escalations[0]["reason"]


def test_unknown_outcome_caught_by_the_agent_is_resolved_when_the_saga_commits() -> None:
    """The agent handled the error and finished; the attempt may still have landed, so
    the commit consults the resolver, and a landed effect is compensated (never forgotten).
    """
    undone: list[str] = []
    case = ResolverCase(
        "commit_landed", Resolution.landed(Compensation(fn=lambda: undone.append("charge")))
    )
    log = MemoryLog()

    with saga(log=log):
        with pytest.raises(TimeoutError):
            case.charge("cus_1", amount=1)

    assert len(case.calls) == 1
    assert undone == ["charge"]
    assert outcome_of_saga(log) == ["committed"]


def test_unknown_outcome_caught_by_the_agent_without_resolver_escalates_at_commit() -> None:
    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def charge() -> None:
        raise TimeoutError

    log = MemoryLog()
    with saga(log=log) as s:
        with pytest.raises(TimeoutError):
            charge()

    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [1]
    assert outcome_of_saga(log) == ["escalated"]
    assert len(s.escalations) == 1


def test_landed_compensation_failing_at_commit_is_escalated() -> None:
    def broken() -> None:
        raise ConnectionError("refund API down")

    case = ResolverCase("commit_broken", Resolution.landed(Compensation(fn=broken)))
    log = MemoryLog()

    with saga(log=log, compensation_retry=NO_WAIT):
        with pytest.raises(TimeoutError):
            case.charge("cus_1", amount=1)

    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [1]
    assert outcome_of_saga(log) == ["escalated"]


# --- forward retries -------------------------------------------------------------------


class FlakyCharge:
    """A tool failing ``failures`` times with ``error_type`` before it succeeds."""

    def __init__(self, failures: int, error_type: type[Exception], **tool_options: Any) -> None:
        self.keys: list[str] = []
        self.undone: list[str] = []

        @tool(
            semantics=ActionSemantics.COMPENSABLE,
            compensate=lambda r: Compensation(fn=lambda: self.undone.append(r)),
            retry=RetryPolicy(attempts=3, initial_delay=0),
            name="charge",
            **tool_options,
        )
        def charge(amount: int, idempotency_key: str = "") -> str:
            self.keys.append(idempotency_key)
            if len(self.keys) <= failures:
                raise error_type(f"attempt {len(self.keys)} failed")
            return "ch_1"

        self.charge = charge


def test_forward_retries_record_every_attempt_under_one_idempotency_key() -> None:
    flaky = FlakyCharge(2, TimeoutError, idempotent=True)
    log = MemoryLog()

    with saga(log=log) as s:
        assert flaky.charge(amount=5) == "ch_1"

    key = R.idempotency_key(s.id, 1)
    assert flaky.keys == [key, key, key]
    intents = log.of_type(R.INTENT)
    assert [r["attempt"] for r in intents] == [1, 2, 3]
    assert {r["idempotency_key"] for r in intents} == {key}
    assert all(r["kwargs"] == {"amount": 5} for r in intents)
    failed = log.of_type(R.FORWARD_FAILED)
    assert [(r["attempt"], r["outcome"]) for r in failed] == [(1, "unknown"), (2, "unknown")]
    [committed] = log.of_type(R.COMMITTED)
    assert committed["attempt"] == 3
    assert [r["type"] for r in log.records if r["type"] in (R.INTENT, R.FORWARD_FAILED)] == [
        R.INTENT,
        R.FORWARD_FAILED,
        R.INTENT,
        R.FORWARD_FAILED,
        R.INTENT,
    ]
    assert log.of_type(R.ESCALATED) == []
    assert outcome_of_saga(log) == ["committed"]


def test_retried_non_idempotent_call_is_escalated_at_commit() -> None:
    flaky = FlakyCharge(1, TimeoutError)
    log = MemoryLog()

    with saga(log=log):
        flaky.charge(amount=5)

    [escalated] = log.of_type(R.ESCALATED)
    assert "[1]" in escalated["reason"]
    assert "more than once" in escalated["reason"]
    assert outcome_of_saga(log) == ["escalated"]


def test_retried_non_idempotent_call_does_not_orphan_its_first_attempt_on_rollback() -> None:
    """SPEC §10.6: attempt 1 raised with unknown outcome and may have landed; attempt 2
    succeeded. Rolling back compensates attempt 2 — attempt 1 must not be forgotten: it
    is escalated (as it is when the saga commits).
    """
    flaky = FlakyCharge(1, TimeoutError)
    log = MemoryLog()

    with pytest.raises(Exception):
        with saga(log=log):
            flaky.charge(amount=5)
            raise AgentError

    assert flaky.undone == ["ch_1"]
    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [1]


def test_retries_after_no_effect_errors_need_no_escalation() -> None:
    flaky = FlakyCharge(2, Declined, no_effect_on=(Declined,))
    log = MemoryLog()

    with saga(log=log):
        flaky.charge(amount=5)

    assert [r["outcome"] for r in log.of_type(R.FORWARD_FAILED)] == ["no_effect", "no_effect"]
    assert log.of_type(R.ESCALATED) == []
    assert outcome_of_saga(log) == ["committed"]


def test_exhausted_retries_raise_the_last_error_and_escalate_the_unknown_step() -> None:
    flaky = FlakyCharge(5, TimeoutError)
    log = MemoryLog()
    raised: list[BaseException] = []

    with pytest.raises(CompensationFailed) as caught:
        with saga(log=log):
            try:
                flaky.charge(amount=5)
            except TimeoutError as exc:
                raised.append(exc)
                raise

    assert len(flaky.keys) == 3
    assert str(raised[0]) == "attempt 3 failed"
    assert caught.value.__cause__ is raised[0]
    assert [r["attempt"] for r in log.of_type(R.FORWARD_FAILED)] == [1, 2, 3]
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 1


def test_exceptions_outside_retry_on_are_not_retried() -> None:
    calls: list[int] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=print),
        retry=RetryPolicy(attempts=3, initial_delay=0),
        retry_on=(TimeoutError,),
        no_effect_on=(Declined,),
    )
    def charge() -> None:
        calls.append(1)
        raise Declined

    with pytest.raises(Declined):
        with saga(log=MemoryLog()):
            charge()

    assert calls == [1]


# --- idempotency keys and recovery tokens ----------------------------------------------


async def test_async_tool_accepting_idempotency_key_receives_the_deterministic_key() -> None:
    keys: list[str] = []

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    async def charge(amount: int, *, idempotency_key: str = "") -> None:
        keys.append(idempotency_key)

    async with saga(log=MemoryLog()) as s:
        await charge(amount=1)
        await charge(amount=2)

    assert keys == [R.idempotency_key(s.id, 1), R.idempotency_key(s.id, 2)]
    assert keys[0] != keys[1]


def test_caller_supplied_idempotency_key_is_not_overridden() -> None:
    keys: list[str] = []

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def charge(amount: int, idempotency_key: str = "") -> None:
        keys.append(idempotency_key)

    with saga(log=MemoryLog()):
        charge(amount=1, idempotency_key="mine")

    assert keys == ["mine"]


@pytest.mark.parametrize("use_async", [False, True])
def test_registered_compensation_handler_receives_the_recovery_token(use_async: bool) -> None:
    received: list[dict[str, Any]] = []

    if use_async:

        async def refund(charge_id: str, idempotency_key: str) -> None:
            received.append({"charge_id": charge_id, "idempotency_key": idempotency_key})

    else:

        def refund(charge_id: str, idempotency_key: str) -> None:  # type: ignore[misc]
            received.append({"charge_id": charge_id, "idempotency_key": idempotency_key})

    register_handler("tests.core.idempotency.refund", refund)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(
            handler="tests.core.idempotency.refund", kwargs={"charge_id": r}
        ),
        handler="tests.core.idempotency.refund",
    )
    def charge() -> str:
        return "ch_7"

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def noop() -> None:
        return None

    log = MemoryLog()
    with pytest.raises(AgentError):
        with saga(log=log) as s:
            noop()
            charge()
            raise AgentError

    token = R.recovery_token(s.id, 2)
    assert received == [{"charge_id": "ch_7", "idempotency_key": token}]
    [committed] = [r for r in log.of_type(R.COMMITTED) if r["step"] == 2]
    assert committed["token"] == token
    assert committed["handler"] == "tests.core.idempotency.refund"
    assert committed["kwargs"] == {"charge_id": "ch_7"}
    assert [r["token"] for r in log.of_type(R.COMPENSATED) if r["step"] == 2] == [token]


def test_compensation_fn_without_idempotency_key_parameter_is_called_without_it() -> None:
    received: list[str] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(
            fn=lambda charge_id: received.append(charge_id), kwargs={"charge_id": r}
        ),
    )
    def charge() -> str:
        return "ch_3"

    with pytest.raises(AgentError):
        with saga(log=MemoryLog()):
            charge()
            raise AgentError

    assert received == ["ch_3"]


async def test_a_call_timed_out_by_the_agent_is_unknown_and_resolved_on_rollback() -> None:
    """``asyncio.wait_for`` cancels the tool mid-call: the charge may have landed, so the
    step's outcome is UNKNOWN and the resolver settles it when the saga rolls back."""
    landed: list[str] = []
    refunded: list[str] = []
    never = asyncio.Event()

    @register_handler("test.timeout.resolve")
    def resolve(*, tool: str, kwargs: dict[str, Any], preimage: Any, idempotency_key: str) -> Any:
        if landed:
            return Resolution.landed(Compensation(fn=lambda: refunded.append(landed[0])))
        return Resolution.no_effect()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: refunded.append(r)),
        resolver="test.timeout.resolve",
        name="slow_charge",
    )
    async def slow_charge() -> str:
        landed.append("ch_slow")  # the provider took the money...
        await never.wait()  # ...and the answer never came back
        return "ch_slow"

    log = MemoryLog()
    with pytest.raises(TimeoutError):
        async with saga(log=log):
            await asyncio.wait_for(slow_charge(), timeout=0.05)
    [failed] = log.of_type(R.FORWARD_FAILED)
    assert failed["outcome"] == "unknown"
    assert refunded == ["ch_slow"]
    assert log.of_type(R.SAGA_END)[0]["outcome"] == "rolled_back"
