"""Traps a first-time user fell into, now errors that say what happened and what to do."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    CompensationFailed,
    OutcomeUnknown,
    SagaUsageError,
    register_handler,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog


class CardDeclined(Exception):
    """What a payment SDK raises when the card was refused."""


@pytest.fixture
def refunds() -> list[str]:
    done: list[str] = []
    register_handler("pay.refund", lambda charge_id: done.append(charge_id))
    return done


def _charge_tool(**options: object):
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="pay.refund", kwargs={"charge_id": r}),
        **options,  # type: ignore[arg-type]
    )
    def charge(card: str) -> str:
        if card == "declined":
            raise CardDeclined("Your card was declined.")
        return f"ch_{card}"

    return charge


def test_a_tool_that_raises_names_the_step_the_exception_and_the_fix(refunds) -> None:
    charge = _charge_tool()
    with pytest.raises(CompensationFailed) as info, saga("checkout", log=MemoryLog()):
        charge(card="ok")
        charge(card="declined")
    message = str(info.value)
    assert "step 2 (" in message
    assert "CardDeclined" in message
    assert "no_effect_on=(CardDeclined,)" in message
    assert "resolver=" in message
    assert isinstance(info.value.__cause__, CardDeclined)
    [(step, _, error)] = info.value.failures
    assert step == 2
    assert isinstance(error, OutcomeUnknown)
    assert error.error is not None
    assert error.error.startswith("CardDeclined")
    assert refunds == ["ch_ok"], "the step that did complete was still refunded"


def test_with_no_effect_on_the_original_exception_propagates_unchanged(refunds) -> None:
    charge = _charge_tool(no_effect_on=(CardDeclined,))
    with pytest.raises(CardDeclined), saga("checkout", log=MemoryLog()):
        charge(card="ok")
        charge(card="declined")
    assert refunds == ["ch_ok"]


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="pay.refund", kwargs={"charge_id": r}),
)
async def charge_async(card: str) -> str:
    return f"ch_{card}"


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="pay.refund", kwargs={"charge_id": r}),
)
def charge_sync(card: str) -> str:
    return f"ch_{card}"


def test_an_async_tool_is_still_a_coroutine_function_to_frameworks() -> None:
    assert inspect.iscoroutinefunction(charge_async)
    assert asyncio.iscoroutinefunction(charge_async)
    assert inspect.signature(charge_async) == inspect.signature(charge_async.__wrapped__)
    assert charge_async.__name__ == "charge_async"


@pytest.mark.parametrize("forgotten", [charge_async, charge_sync], ids=["async", "sync"])
async def test_a_tool_call_never_awaited_fails_the_saga_and_names_the_tool(
    refunds, forgotten
) -> None:
    with pytest.raises(SagaUsageError, match="never awaited") as info:
        async with saga("forgetful", log=MemoryLog()):
            await charge_async(card="first")
            forgotten(card="second")  # no await: the step never runs
    assert forgotten.__agent_saga_tool__.name in str(info.value)
    assert refunds == ["ch_first"], "the saga was rolled back like any failed saga"


async def test_awaited_and_gathered_calls_are_fine(refunds) -> None:
    async with saga("careful", log=MemoryLog()):
        await charge_async(card="a")
        await asyncio.gather(charge_async(card="b"), charge_sync(card="c"))
    assert refunds == []


async def test_a_saga_that_failed_anyway_keeps_its_own_exception_with_a_note(refunds) -> None:
    with pytest.raises(RuntimeError, match="model hallucinated") as info:
        async with saga("both", log=MemoryLog()):
            await charge_async(card="a")
            charge_async(card="b")
            raise RuntimeError("the model hallucinated")
    assert any("never awaited" in note for note in info.value.__notes__)
    assert refunds == ["ch_a"]


async def test_a_long_saga_keeps_only_the_tool_calls_still_pending(refunds) -> None:
    @tool(semantics=ActionSemantics.REVERSIBLE)
    async def peek(n: int) -> int:
        return n

    async with saga("long", log=MemoryLog()) as s:
        for n in range(5000):
            await peek(n=n)
        pending = [peek(n=-1) for _ in range(3)]
        for coro in pending:
            await coro
        assert len(s.run.calls) < 2048, "finished calls are not kept for the saga's life"
