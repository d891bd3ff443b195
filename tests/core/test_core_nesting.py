"""Nested sagas are savepoints: an inner failure undoes only the inner steps."""

from __future__ import annotations

from typing import Any

import pytest

from agent_saga import ActionSemantics, Compensation, SagaUsageError, saga, tool
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R


class Steps:
    """A family of COMPENSABLE tools (sync and async) that log forward and undo."""

    def __init__(self) -> None:
        self.forward: list[str] = []
        self.undone: list[str] = []

        @tool(
            semantics=ActionSemantics.COMPENSABLE,
            compensate=lambda label: Compensation(
                fn=lambda label: self.undone.append(label), kwargs={"label": label}
            ),
            name="act",
        )
        def act(label: str) -> str:
            self.forward.append(label)
            return label

        @tool(
            semantics=ActionSemantics.COMPENSABLE,
            compensate=lambda label: Compensation(
                fn=lambda label: self.undone.append(label), kwargs={"label": label}
            ),
            name="act_async",
        )
        async def act_async(label: str) -> str:
            self.forward.append(label)
            return label

        self.act: Any = act
        self.act_async: Any = act_async


class InnerFailure(Exception):
    pass


class OuterFailure(Exception):
    pass


def test_inner_failure_undoes_only_inner_steps_and_outer_commits() -> None:
    steps, log = Steps(), MemoryLog()

    with saga("outer", log=log) as outer:
        steps.act("A")
        with pytest.raises(InnerFailure):
            with saga("inner"):
                steps.act("B")
                steps.act("C")
                raise InnerFailure
        steps.act("D")
        assert [name for _, name, _ in outer.steps()] == ["act", "act"]

    assert steps.undone == ["C", "B"]
    assert log.of_type(R.SAGA_BEGIN)[0]["saga"] == outer.id
    assert len(log.of_type(R.SAGA_BEGIN)) == 1, "a savepoint is part of its outer saga"
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["committed"]


def test_inner_success_then_outer_failure_undoes_everything_newest_first() -> None:
    steps, log = Steps(), MemoryLog()

    with pytest.raises(OuterFailure):
        with saga(log=log):
            steps.act("A")
            with saga():
                steps.act("B")
                with saga():
                    steps.act("C")
                steps.act("D")
            steps.act("E")
            raise OuterFailure

    assert steps.undone == ["E", "D", "C", "B", "A"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


def test_inner_failure_after_an_inner_savepoint_committed_undoes_that_savepoint_too() -> None:
    steps = Steps()

    with saga(log=MemoryLog()):
        steps.act("A")
        with pytest.raises(InnerFailure):
            with saga():
                steps.act("B")
                with saga():
                    steps.act("C")
                steps.act("D")
                raise InnerFailure
        steps.act("E")

    assert steps.undone == ["D", "C", "B"]


async def test_nested_async_sagas_unwind_like_sync_ones() -> None:
    steps, log = Steps(), MemoryLog()

    with pytest.raises(OuterFailure):
        async with saga(log=log):
            await steps.act_async("A")
            with pytest.raises(InnerFailure):
                async with saga():
                    await steps.act("B")
                    await steps.act_async("C")
                    raise InnerFailure
            async with saga():
                await steps.act_async("D")
            await steps.act("E")
            raise OuterFailure

    assert steps.undone == ["C", "B", "E", "D", "A"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


async def test_nested_async_inner_failure_lets_outer_commit() -> None:
    steps, log = Steps(), MemoryLog()

    async with saga(log=log):
        await steps.act_async("A")
        with pytest.raises(InnerFailure):
            async with saga():
                await steps.act_async("B")
                raise InnerFailure
        await steps.act_async("C")

    assert steps.undone == ["B"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["committed"]


def test_nested_saga_refuses_its_own_log() -> None:
    with saga(log=MemoryLog()):
        with pytest.raises(SagaUsageError):
            with saga(log=MemoryLog()):
                pass


def test_decorated_saga_called_inside_a_saga_is_a_savepoint() -> None:
    steps, log = Steps(), MemoryLog()

    @saga
    def sub_task(fail: bool) -> None:
        steps.act("sub")
        if fail:
            raise InnerFailure

    with saga(log=log):
        steps.act("A")
        with pytest.raises(InnerFailure):
            sub_task(True)
        sub_task(False)

    assert steps.undone == ["sub"]
    assert steps.forward == ["A", "sub", "sub"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["committed"]
