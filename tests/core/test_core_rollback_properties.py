"""Property: whatever the steps and wherever the failure, exactly the completed steps are undone.

For any sequence of REVERSIBLE (snapshot or factory) and COMPENSABLE steps, made of sync
and async tools with sync and async undo functions, in a sync or an async saga, and any
failure point (the agent raising after k steps, or the k-th tool raising), every completed
step is undone exactly once, newest first, and the original exception object propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_saga import ActionSemantics, Compensation, CompensationFailed, saga, tool
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R

KINDS = ("reversible_snapshot", "reversible_factory", "compensable")


class Boom(Exception):
    """The failure the agent or a tool raises."""


@dataclass(frozen=True)
class StepPlan:
    kind: str
    tool_is_async: bool
    undo_is_async: bool


@dataclass
class Ledger:
    forward: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)


def _undo_fn(ledger: Ledger, label: str, is_async: bool) -> Callable[[], Any]:
    if is_async:

        async def undo_async(**kwargs: Any) -> None:
            await asyncio.sleep(0)
            ledger.undone.append(label)

        return undo_async

    def undo(**kwargs: Any) -> None:
        ledger.undone.append(label)

    return undo


def _build_tool(
    plan: StepPlan, label: str, ledger: Ledger, error: Boom | None
) -> Callable[..., Any]:
    undo = _undo_fn(ledger, label, plan.undo_is_async)

    def body() -> str:
        ledger.forward.append(label)
        if error is not None:
            raise error
        return label

    if plan.tool_is_async:

        async def fn() -> str:
            await asyncio.sleep(0)
            return body()

    else:

        def fn() -> str:
            return body()

    fn.__name__ = fn.__qualname__ = label
    if plan.kind == "reversible_snapshot":
        return tool(semantics=ActionSemantics.REVERSIBLE, snapshot=lambda: undo)(fn)
    if plan.kind == "reversible_factory":
        return tool(
            semantics=ActionSemantics.REVERSIBLE, compensate=lambda result: Compensation(fn=undo)
        )(fn)
    return tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda result: Compensation(fn=undo, kwargs={"label": result}),
        no_effect_on=(Boom,),
    )(fn)


@st.composite
def scenarios(draw: st.DrawFn, *, async_tools: bool) -> tuple[list[StepPlan], str, int]:
    plans = draw(
        st.lists(
            st.builds(
                StepPlan,
                kind=st.sampled_from(KINDS),
                tool_is_async=st.booleans() if async_tools else st.just(False),
                undo_is_async=st.booleans(),
            ),
            max_size=6,
        )
    )
    where = draw(st.sampled_from(["agent", "tool"] if plans else ["agent"]))
    k = draw(st.integers(0, len(plans) if where == "agent" else len(plans) - 1))
    return plans, where, k


def _expected_undone(plans: list[StepPlan], where: str, k: int) -> list[str]:
    expected = [f"s{i}" for i in reversed(range(k))]
    if where == "tool" and plans[k].kind == "reversible_snapshot":
        # A REVERSIBLE call that raised is restored from its snapshot: restoring is exact.
        expected.insert(0, f"s{k}")
    return expected


def _check_log(log: MemoryLog, plans: list[StepPlan], where: str, k: int) -> None:
    started = k + 1 if where == "tool" else k
    durable_started = [p for p in plans[:started] if p.kind == "compensable"]
    durable_completed = [p for p in plans[:k] if p.kind == "compensable"]
    if not durable_started:
        assert log.records == []
        assert log.pending == []
        return
    assert len(log.of_type(R.COMPENSATED)) == len(durable_completed)
    assert log.of_type(R.ESCALATED) == []
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenarios(async_tools=False))
def test_sync_saga_undoes_exactly_the_completed_steps_newest_first(
    scenario: tuple[list[StepPlan], str, int],
) -> None:
    plans, where, k = scenario
    ledger = Ledger()
    error = Boom("agent failed")
    tools = [
        _build_tool(p, f"s{i}", ledger, error if (where == "tool" and i == k) else None)
        for i, p in enumerate(plans)
    ]
    log = MemoryLog()

    with pytest.raises(Boom) as caught:
        with saga(log=log):
            for i, t in enumerate(tools):
                if where == "agent" and i == k:
                    raise error
                t()
            if where == "agent":
                raise error

    assert caught.value is error
    assert ledger.forward == [f"s{i}" for i in range(k + (where == "tool"))]
    assert ledger.undone == _expected_undone(plans, where, k)
    _check_log(log, plans, where, k)


@SETTINGS
@given(scenarios(async_tools=True))
def test_async_saga_undoes_exactly_the_completed_steps_newest_first(
    scenario: tuple[list[StepPlan], str, int],
) -> None:
    plans, where, k = scenario
    ledger = Ledger()
    error = Boom("agent failed")
    tools = [
        _build_tool(p, f"s{i}", ledger, error if (where == "tool" and i == k) else None)
        for i, p in enumerate(plans)
    ]
    log = MemoryLog()

    async def agent() -> None:
        async with saga(log=log):
            for i, t in enumerate(tools):
                if where == "agent" and i == k:
                    raise error
                await t()
            if where == "agent":
                raise error

    with pytest.raises(Boom) as caught:
        asyncio.run(agent())

    assert caught.value is error
    assert ledger.forward == [f"s{i}" for i in range(k + (where == "tool"))]
    assert ledger.undone == _expected_undone(plans, where, k)
    _check_log(log, plans, where, k)


@SETTINGS
@given(scenarios(async_tools=True))
def test_a_saga_that_does_not_fail_undoes_nothing_and_commits(
    scenario: tuple[list[StepPlan], str, int],
) -> None:
    plans, _, _ = scenario
    ledger = Ledger()
    tools = [_build_tool(p, f"s{i}", ledger, None) for i, p in enumerate(plans)]
    log = MemoryLog()

    async def agent() -> None:
        async with saga(log=log):
            for t in tools:
                await t()

    asyncio.run(agent())

    assert ledger.forward == [f"s{i}" for i in range(len(plans))]
    assert ledger.undone == []
    if any(p.kind == "compensable" for p in plans):
        assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["committed"]
    else:
        assert log.records == []


def test_tool_that_raised_with_unknown_outcome_is_escalated_not_compensated() -> None:
    """No ``no_effect_on``, no resolver: the call may have landed, so a human decides.

    The completed step before it is still compensated (SPEC §10.3: compensate what is
    known; escalate only the step that cannot be decided), and the caller learns that
    the rollback is incomplete (``CompensationFailed`` caused by the original error).
    """
    ledger = Ledger()
    error = RuntimeError("connection reset mid-call")

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: ledger.undone.append("first")),
    )
    def first() -> None:
        ledger.forward.append("first")

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: ledger.undone.append("flaky")),
    )
    def flaky() -> None:
        ledger.forward.append("flaky")
        raise error

    log = MemoryLog()
    with pytest.raises(CompensationFailed) as caught:
        with saga(log=log):
            first()
            flaky()

    assert ledger.undone == ["first"]
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 2
    assert "outcome unknown" in escalated["reason"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["escalated"]
    # The rollback could not restore everything, so the caller must hear it: the
    # escalated step is listed and the original exception is the cause.
    assert caught.value.__cause__ is error
    assert [(sid, name.rsplit(".", 1)[-1]) for sid, name, _ in caught.value.failures] == [
        (2, "flaky")
    ]
