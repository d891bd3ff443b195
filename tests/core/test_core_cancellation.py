"""Cancellation and interrupts: a cancelled or interrupted saga still unwinds, fully.

Order is controlled with ``asyncio.Event``s, never with sleeps.
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
    SagaUsageError,
    register_handler,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R


def recording_tool(undone: list[str], label: str) -> Any:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda **kw: undone.append(label), kwargs={}),
        name=label,
    )
    async def step() -> str:
        return label

    return step


async def test_cancelled_async_saga_rolls_back_completed_steps() -> None:
    undone: list[str] = []
    first, second = recording_tool(undone, "first"), recording_tool(undone, "second")
    waiting, never = asyncio.Event(), asyncio.Event()
    log = MemoryLog()

    @tool(semantics=ActionSemantics.REVERSIBLE)
    async def think() -> None:
        waiting.set()
        await never.wait()

    async def agent() -> None:
        async with saga(log=log):
            await first()
            await second()
            await think()

    task = asyncio.create_task(agent())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert undone == ["second", "first"]
    assert [r["step"] for r in log.of_type(R.COMPENSATED)] == [2, 1]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


async def test_durable_call_cancelled_mid_flight_is_escalated_not_forgotten() -> None:
    """A cancelled forward call may have landed (SPEC §10.6): never silently dropped."""
    undone: list[str] = []
    first = recording_tool(undone, "first")
    waiting, never = asyncio.Event(), asyncio.Event()
    log = MemoryLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("charge")),
        no_effect_on=(ValueError,),
    )
    async def charge() -> None:
        waiting.set()
        await never.wait()

    async def agent() -> None:
        async with saga(log=log):
            await first()
            await charge()

    task = asyncio.create_task(agent())
    await waiting.wait()
    task.cancel()
    with pytest.raises(BaseException):  # see the next test for *which* exception
        await task

    assert undone == ["first"]
    [failed] = log.of_type(R.FORWARD_FAILED)
    assert (failed["step"], failed["outcome"]) == (2, "unknown")
    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [2]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["escalated"]


async def test_compensation_runs_to_completion_when_cancelled_again_during_rollback() -> None:
    undone: list[str] = []
    log = MemoryLog()
    compensation_started, release_compensation = asyncio.Event(), asyncio.Event()
    tool_waiting, never = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def slow_refund(charge_id: str) -> None:
        compensation_started.set()
        await release_compensation.wait()
        finished.append(charge_id)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=slow_refund, kwargs={"charge_id": r}),
    )
    async def charge() -> str:
        return "ch_1"

    async def agent() -> None:
        async with saga(log=log):
            await charge()
            tool_waiting.set()
            await never.wait()

    task = asyncio.create_task(agent())
    await tool_waiting.wait()
    task.cancel()
    await compensation_started.wait()
    task.cancel()  # cancelled again while the compensation runs
    task.cancel()
    release_compensation.set()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert finished == ["ch_1"]
    assert [r["step"] for r in log.of_type(R.COMPENSATED)] == [1]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]
    assert undone == []


async def test_cancellation_stays_a_cancellation_when_the_rollback_escalates() -> None:
    """A cancelled task must end cancelled even if its rollback had to escalate.

    Replacing ``CancelledError`` with ``CompensationFailed`` (an ``Exception``) breaks
    ``asyncio.timeout``/``TaskGroup`` semantics and lets ``except Exception`` swallow a
    cancellation; the escalation is in the log and in ``scope.escalations`` either way.
    """
    waiting, never = asyncio.Event(), asyncio.Event()
    log = MemoryLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: None),
    )
    async def charge() -> None:
        waiting.set()
        await never.wait()

    async def agent() -> None:
        async with saga(log=log):
            await charge()

    task = asyncio.create_task(agent())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [1]


def test_keyboard_interrupt_inside_a_sync_saga_rolls_back_and_propagates() -> None:
    undone: list[str] = []
    log = MemoryLog()
    interrupt = KeyboardInterrupt()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("charge")),
    )
    def charge() -> None:
        return None

    with pytest.raises(KeyboardInterrupt) as caught:
        with saga(log=log):
            charge()
            raise interrupt

    assert caught.value is interrupt
    assert undone == ["charge"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


def test_keyboard_interrupt_during_a_sync_tool_call_leaves_its_outcome_unknown() -> None:
    """Ctrl-C during the call: the earlier step is compensated, the interrupted one
    escalated, and Ctrl-C still reaches the caller as KeyboardInterrupt (not as an
    ``Exception`` that ``except Exception`` would swallow)."""
    undone: list[str] = []
    log = MemoryLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("first")),
    )
    def first() -> None:
        return None

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("second")),
        no_effect_on=(KeyboardInterrupt,),  # an interrupt never proves "no effect"
    )
    def second() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with saga(log=log):
            first()
            second()

    assert undone == ["first"]
    [failed] = log.of_type(R.FORWARD_FAILED)
    assert failed["outcome"] == "unknown"
    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [2]


async def test_tools_gathered_in_one_saga_unwind_in_reverse_completion_order() -> None:
    undone: list[str] = []
    log = MemoryLog()
    go = {name: asyncio.Event() for name in ("a", "b", "c")}
    # Completion order b, c, a: each factory releases the next tool.
    release_after = {"b": "c", "c": "a", "a": None}

    def make(name: str) -> Any:
        def factory(result: str) -> Compensation:
            nxt = release_after[name]
            if nxt is not None:
                go[nxt].set()
            return Compensation(fn=lambda **kw: undone.append(name), kwargs={"id": result})

        @tool(semantics=ActionSemantics.COMPENSABLE, compensate=factory, name=name)
        async def step() -> str:
            await go[name].wait()
            return name

        return step

    a, b, c = make("a"), make("b"), make("c")
    error = RuntimeError("model gave up")

    with pytest.raises(RuntimeError) as caught:
        async with saga(log=log):
            started = asyncio.gather(a(), b(), c())
            go["b"].set()
            assert await started == ["a", "b", "c"]
            raise error

    assert caught.value is error
    assert [r["tool"] for r in log.of_type(R.INTENT)] == ["a", "b", "c"]
    order = {r["step"]: r["tool"] for r in log.of_type(R.INTENT)}
    assert [order[r["step"]] for r in log.of_type(R.COMMITTED)] == ["b", "c", "a"]
    assert undone == ["a", "c", "b"]
    assert [order[r["step"]] for r in log.of_type(R.COMPENSATED)] == ["a", "c", "b"]


async def test_compensable_step_cancelled_while_its_commit_is_being_written_is_still_undone() -> (
    None
):
    """The forward call has landed and its compensation is known; the COMMITTED append is
    then interrupted (cancelled). The rollback must still undo (or escalate) the step —
    it must not vanish from the unwind list while a ``saga_end`` closes the saga.
    """
    undone: list[str] = []
    commit_writing, never = asyncio.Event(), asyncio.Event()

    class SlowCommitLog(MemoryLog):
        async def append_async(self, record: dict[str, Any]) -> None:
            if record["type"] == R.COMMITTED:
                commit_writing.set()
                await never.wait()
            self.append(record)

    log = SlowCommitLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("charge")),
    )
    async def charge() -> str:
        return "ch_1"

    async def agent() -> None:
        async with saga(log=log):
            await charge()

    task = asyncio.create_task(agent())
    await commit_writing.wait()
    task.cancel()
    with pytest.raises(BaseException):
        await task

    handled = undone == ["charge"] or [r["step"] for r in log.of_type(R.ESCALATED)] == [1]
    assert handled, f"step 1 landed but was neither compensated nor escalated: {log.types()}"


def test_ctrl_c_during_a_sync_rollback_is_held_until_every_compensation_ran() -> None:
    import os
    import signal

    undone: list[str] = []

    def interrupting_undo() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives mid-rollback
        undone.append("second")

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("first")),
    )
    def first() -> None:
        return None

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=interrupting_undo),
    )
    def second() -> None:
        return None

    log = MemoryLog()
    with pytest.raises(KeyboardInterrupt):
        with saga(log=log):
            first()
            second()
            raise RuntimeError("agent failed")

    assert undone == ["second", "first"]
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


def _slow_and_failing_pair(
    undone: list[str], landed: list[str], release: asyncio.Event, *, resolver: str | None = None
) -> tuple[Any, Any]:
    """A slow COMPENSABLE charge, and a sibling that fails once the charge is in flight.

    The charge's effect lands when ``release`` is set, however its task ends — like a
    provider that already accepted the request — and ``landed`` says so.
    """
    in_flight = asyncio.Event()

    async def land_when_released() -> None:
        await release.wait()
        landed.append("ch_slow")

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append(r)),
        name="slow",
        resolver=resolver,
    )
    async def slow() -> str:
        provider = asyncio.ensure_future(land_when_released())
        in_flight.set()
        await asyncio.shield(provider)
        return "ch_slow"

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=print),
        no_effect_on=(ValueError,),
        name="fast",
    )
    async def fast() -> None:
        await in_flight.wait()
        raise ValueError("declined")

    return slow, fast


async def test_gathered_tool_landing_while_the_saga_unwinds_is_compensated_by_its_result() -> None:
    """``gather`` re-raises the first failure while a sibling tool is still in flight.
    The rollback waits for the sibling's call to finish (it may still land) and undoes
    it by its real result — no guess, no escalation."""
    undone: list[str] = []
    landed: list[str] = []
    release = asyncio.Event()
    log = MemoryLog()
    slow, fast = _slow_and_failing_pair(undone, landed, release)

    async def fail_then_land() -> None:
        await fast()

    async def agent() -> None:
        async with saga(log=log):
            slow_task = asyncio.ensure_future(slow())
            try:
                await asyncio.gather(slow_task, fail_then_land())
            finally:
                # The saga starts unwinding now, with the charge still in flight; the
                # provider lands it a moment later.
                asyncio.get_running_loop().call_soon(release.set)

    with pytest.raises(ValueError, match="declined"):
        await agent()
    assert landed == ["ch_slow"]
    assert undone == ["ch_slow"]  # compensated from the result it really returned
    assert [r["step"] for r in log.of_type(R.COMMITTED)] == [1]
    assert log.of_type(R.ESCALATED) == []
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


_RESOLVER_SAW: list[str] = []


@register_handler("test.cancellation.finds_nothing_yet")
def _finds_nothing_yet(**kw: Any) -> Resolution:
    _RESOLVER_SAW.append(kw["tool"])
    return Resolution.no_effect("no charge with this key (yet)")


async def test_call_cancelled_in_flight_is_never_no_effect_when_its_resolver_finds_nothing() -> (
    None
):
    """Past ``inflight_grace_seconds`` the sibling is cancelled. Its request may still
    land, so a resolver that finds nothing *yet* proves nothing: escalated, not
    "no effect" — and when the charge does land, a human has it in the queue."""
    undone: list[str] = []
    landed: list[str] = []
    release = asyncio.Event()
    log = MemoryLog()
    _RESOLVER_SAW.clear()
    slow, fast = _slow_and_failing_pair(
        undone, landed, release, resolver="test.cancellation.finds_nothing_yet"
    )
    sibling: list[asyncio.Future[Any]] = []

    async def agent() -> None:
        async with saga(log=log, inflight_grace_seconds=0):
            slow_task = asyncio.ensure_future(slow())
            sibling.append(slow_task)
            await asyncio.gather(slow_task, fast())

    with pytest.raises(CompensationFailed) as caught:
        await agent()
    assert isinstance(caught.value.__cause__, ValueError)
    assert sibling[0].cancelled()
    assert _RESOLVER_SAW == ["slow"]  # it was asked; "found" would have been acted on

    release.set()  # the provider lands the charge after all
    await asyncio.sleep(0)
    assert landed == ["ch_slow"]
    [failed] = [r for r in log.of_type(R.FORWARD_FAILED) if r["step"] == 1]
    assert (failed["outcome"], failed["interrupted"]) == ("unknown", True)
    escalated = log.of_type(R.ESCALATED)
    assert [r["step"] for r in escalated] == [1]
    assert "interrupted while in flight" in escalated[0]["reason"]
    assert "may still land" in escalated[0]["reason"]
    assert not any(r.get("outcome") == "no_effect" for r in log.of_type(R.COMPENSATED))
    assert log.types()[-1] == R.SAGA_END, "nothing is recorded after the saga ended"


def test_inflight_grace_must_be_a_non_negative_number() -> None:
    for bad in (-1, "5", True, float("nan")):
        with pytest.raises(SagaUsageError, match="inflight_grace_seconds"):
            saga(inflight_grace_seconds=bad)  # type: ignore[arg-type]


async def test_reversible_sibling_finishing_after_the_unwind_restores_itself() -> None:
    """REVERSIBLE steps are not tracked as in flight (no I/O, no bookkeeping on the fast
    path); one that completes after its saga unwound restores its snapshot at once."""
    state = {"cache": "old"}
    started, release = asyncio.Event(), asyncio.Event()

    def snapshot() -> Any:
        before = state["cache"]
        return lambda: state.__setitem__("cache", before)

    @tool(semantics=ActionSemantics.REVERSIBLE, snapshot=snapshot)
    async def slow_cache_write() -> None:
        started.set()
        await release.wait()
        state["cache"] = "new"

    async def fail() -> None:
        await started.wait()
        raise ValueError("boom")

    sibling: list[asyncio.Future[Any]] = []

    async def agent() -> None:
        async with saga(log=MemoryLog()):
            task = asyncio.ensure_future(slow_cache_write())
            sibling.append(task)
            await asyncio.gather(task, fail())

    with pytest.raises(ValueError, match="boom"):
        await agent()
    release.set()
    await sibling[0]
    assert state["cache"] == "old"
