"""The straight-line async step writes what the generator protocol writes, byte for byte.

``_runtime.straight_step_async`` drives the engine's pieces without a generator for
the common COMPENSABLE step. Every scenario here runs twice — straight, and with the
straight path switched off — and the two logs must hold the same records (saga ids,
times and tokens aside), the same steps must be undone, and the same error raised.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    RetryPolicy,
    _runtime,
    register_handler,
    saga,
    tool,
)
from agent_saga import _engine as E
from agent_saga.wal import Record, scan

undone: list[str] = []
register_handler("test.straight.refund", lambda charge_id: undone.append(charge_id))


class Declined(Exception):
    """The service refused: nothing happened."""


class Timeout(Exception):
    """The service did not answer: the outcome is unknown."""


def _refund(result: str) -> Compensation:
    if result == "ch_bad-factory":
        raise ValueError("cannot derive the refund")
    return Compensation(handler="test.straight.refund", kwargs={"charge_id": result})


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_refund,
    no_effect_on=(Declined,),
    name="test.straight.charge",
)
async def charge(card: str, amount: int = 100) -> str:
    """Charge ``card``; some cards make the service misbehave."""
    if card == "declined":
        raise Declined(card)
    if card == "timeout":
        raise Timeout(card)
    return f"ch_{card}"


def _normalised(path: Path) -> list[dict[str, Any]]:
    out = []
    for item in scan(path):
        if isinstance(item, Record) and not item.meta:
            rec = {k: v for k, v in item.data.items() if k not in ("ts", "saga", "owner", "by")}
            for key in ("idempotency_key", "token", "escalation"):
                if key in rec:
                    rec[key] = "<derived>"
            out.append(rec)
    return out


SCENARIOS: dict[str, list[str]] = {
    "commits": ["a", "b", "c"],
    "no effect, then rollback": ["a", "declined"],
    "unknown outcome, then rollback": ["a", "timeout"],
    "factory raised": ["a", "bad-factory"],
    "secret in kwargs": ["a", "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"],
}


async def _run(path: Path, cards: list[str]) -> str | None:
    try:
        async with saga(wal_path=str(path), name="straight"):
            for card in cards:
                await charge(card)
    except Exception as exc:
        return type(exc).__name__
    return None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_straight_path_writes_what_the_generator_protocol_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    cards = SCENARIOS[scenario]
    straight_calls: list[str] = []
    real = _runtime.straight_step_async

    async def counting(*args: Any) -> Any:
        straight_calls.append("x")
        return await real(*args)

    monkeypatch.setattr("agent_saga._tool_decorator.straight_step_async", counting)
    undone.clear()
    straight_error = asyncio.run(_run(tmp_path / "straight.wal", cards))
    straight_undone = list(undone)
    assert straight_calls  # the scenario did take the straight path

    monkeypatch.setattr(E, "goes_straight", lambda scope, spec: False)
    straight_calls.clear()
    undone.clear()
    generator_error = asyncio.run(_run(tmp_path / "generator.wal", cards))
    assert not straight_calls

    assert straight_error == generator_error
    assert straight_undone == undone
    assert _normalised(tmp_path / "straight.wal") == _normalised(tmp_path / "generator.wal")


def test_steps_that_need_the_gate_or_retries_take_the_generator_protocol() -> None:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=_refund,
        retry=RetryPolicy(attempts=3),
        name="test.straight.retrying",
    )
    async def retrying(card: str) -> str:
        return card

    @tool(semantics=ActionSemantics.IRREVERSIBLE, name="test.straight.send")
    async def send(to: str) -> None:
        return None

    async def scopes() -> list[bool]:
        seen = []
        async with saga(name="probe"):
            scope = _runtime.current_scope()
            assert scope is not None
            for t in (charge, retrying, send):
                seen.append(E.goes_straight(scope, t.__agent_saga_tool__))
        return seen

    assert asyncio.run(scopes()) == [True, False, False]
