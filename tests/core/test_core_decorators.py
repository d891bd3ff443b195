"""``@tool`` and ``saga`` are thin shells: they keep the function's identity and work in
every form the SPEC promises (§3)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    GateRefused,
    NoActiveSaga,
    SagaUsageError,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R


class Receipt(typing.NamedTuple):
    id: str
    amount: int


def refund(receipt_id: str) -> None:
    """Undo a charge."""


def charge_customer(customer_id: str, amount: int, *, currency: str = "usd") -> Receipt:
    """Charge a customer's card."""
    return Receipt(f"ch_{customer_id}", amount)


async def charge_customer_async(customer_id: str, amount: int, *, currency: str = "usd") -> Receipt:
    """Charge a customer's card, asynchronously."""
    return Receipt(f"ch_{customer_id}", amount)


def comp(r: Receipt) -> Compensation:
    return Compensation(fn=refund, kwargs={"receipt_id": r.id})


@pytest.mark.parametrize("original", [charge_customer, charge_customer_async])
@pytest.mark.parametrize(
    "decorate",
    [
        tool,
        tool(semantics=ActionSemantics.COMPENSABLE, compensate=comp),
        tool(semantics=ActionSemantics.REVERSIBLE),
    ],
    ids=["bare", "compensable", "reversible"],
)
def test_tool_keeps_name_docstring_signature_hints_and_wrapped(
    original: typing.Callable[..., typing.Any], decorate: typing.Callable[..., typing.Any]
) -> None:
    wrapped = decorate(original)

    assert wrapped.__name__ == original.__name__
    assert wrapped.__qualname__ == original.__qualname__
    assert wrapped.__doc__ == original.__doc__
    assert wrapped.__module__ == original.__module__
    assert wrapped.__wrapped__ is original
    assert inspect.signature(wrapped) == inspect.signature(original)
    assert typing.get_type_hints(wrapped) == typing.get_type_hints(original)
    assert inspect.iscoroutinefunction(wrapped) == inspect.iscoroutinefunction(original)


def test_bare_tool_is_irreversible_and_therefore_gated() -> None:
    wrapped = tool(charge_customer)
    with pytest.raises(GateRefused):
        with saga(log=MemoryLog()):
            wrapped("c", 1)


@pytest.mark.parametrize("form", ["bare", "called", "named", "options"])
def test_saga_decorator_forms_keep_identity_and_run_one_saga_per_call(form: str) -> None:
    log = MemoryLog()
    decorators = {
        "bare": saga,
        "called": saga(log=log),
        "named": saga("checkout", log=log),
        "options": saga(name="checkout", log=log, lease_seconds=5),
    }
    charge = tool(semantics=ActionSemantics.COMPENSABLE, compensate=comp)(charge_customer)

    def agent_run(customer: str) -> str:
        """Run the agent."""
        return charge(customer, 10).id

    run = decorators[form](agent_run)
    assert run.__name__ == "agent_run"
    assert run.__doc__ == "Run the agent."
    assert run.__wrapped__ is agent_run
    assert inspect.signature(run) == inspect.signature(agent_run)
    if form == "bare":
        return  # the bare form writes the default WAL; its execution is covered below
    assert run("a") == "ch_a"
    assert run("b") == "ch_b"
    begins = log.of_type(R.SAGA_BEGIN)
    assert len(begins) == 2
    assert begins[0]["saga"] != begins[1]["saga"]
    names = {b["name"] for b in begins}
    if form == "called":
        assert names == {agent_run.__qualname__}
    else:
        assert names == {"checkout"}


async def test_saga_decorator_on_async_function_stays_a_coroutine_function() -> None:
    log = MemoryLog()
    charge = tool(semantics=ActionSemantics.COMPENSABLE, compensate=comp)(charge_customer_async)

    @saga(log=log)
    async def agent_run(customer: str) -> str:
        """Run the agent."""
        return (await charge(customer, 10)).id

    assert inspect.iscoroutinefunction(agent_run)
    assert agent_run.__doc__ == "Run the agent."
    assert await agent_run("z") == "ch_z"
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["committed"]


def test_bare_saga_decorator_runs_a_saga(
    tmp_path: typing.Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``@saga`` with no options: a REVERSIBLE-only run touches no log at all."""
    monkeypatch.chdir(tmp_path)
    restored: list[str] = []

    @tool(semantics=ActionSemantics.REVERSIBLE, snapshot=lambda: lambda: restored.append("x"))
    def cache_put() -> None:
        return None

    @saga
    def agent_run() -> None:
        cache_put()
        raise KeyError("k")

    with pytest.raises(KeyError):
        agent_run()
    assert restored == ["x"]
    assert list(tmp_path.iterdir()) == []


async def test_brief_example_sync_tool_awaited_inside_async_saga() -> None:
    """The brief's own example: sync tools, ``@saga async def``, ``await tool(...)``."""
    refunds: list[str] = []
    reverts: list[str] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda result: Compensation(
            fn=lambda charge_id: refunds.append(charge_id), kwargs={"charge_id": result["id"]}
        ),
    )
    def charge_customer(customer_id: str, amount: int) -> dict[str, str]:
        return {"id": f"ch_{customer_id}_{amount}"}

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda result: Compensation(
            fn=lambda record_id: reverts.append(record_id), kwargs={"record_id": result}
        ),
    )
    def update_crm(record_id: str, status: str) -> str:
        return record_id

    @tool(semantics=ActionSemantics.REVERSIBLE)
    def note(text: str) -> str:
        return text

    log = MemoryLog()

    @saga(log=log)
    async def agent_run() -> None:
        await charge_customer(customer_id="cus_1", amount=4200)
        await update_crm(record_id="acct_1", status="customer")
        assert await note("done") == "done"
        raise RuntimeError("model gave up")

    with pytest.raises(RuntimeError, match="model gave up"):
        await agent_run()

    assert reverts == ["acct_1"]
    assert refunds == ["ch_cus_1_4200"]
    assert [r["step"] for r in log.of_type(R.COMPENSATED)] == [2, 1]


async def test_sync_tool_in_async_saga_can_run_in_a_worker_thread() -> None:
    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def blocking_call(x: int) -> int:
        return x * 2

    log = MemoryLog()
    async with saga(log=log):
        assert await asyncio.to_thread(blocking_call, 21) == 42
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["committed"]


def test_sync_tool_called_outside_a_saga_raises_no_active_saga() -> None:
    calls: list[int] = []

    @tool(semantics=ActionSemantics.REVERSIBLE)
    def reversible() -> None:
        calls.append(1)

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=comp)
    def durable() -> None:
        calls.append(1)

    with pytest.raises(NoActiveSaga):
        reversible()
    with pytest.raises(NoActiveSaga):
        durable()
    assert calls == []


async def test_async_tool_called_outside_a_saga_raises_no_active_saga() -> None:
    calls: list[int] = []

    @tool(semantics=ActionSemantics.REVERSIBLE)
    async def reversible() -> None:
        calls.append(1)

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=comp)
    async def durable() -> None:
        calls.append(1)

    with pytest.raises(NoActiveSaga):
        await reversible()
    with pytest.raises(NoActiveSaga):
        await durable()
    assert calls == []
    assert issubclass(NoActiveSaga, SagaUsageError)


def test_async_tool_in_a_sync_saga_runs_under_asyncio_run_as_a_step_of_that_saga() -> None:
    """An ``async def`` tool stays a coroutine function (frameworks inspect that), so in a
    sync saga it must be driven by an event loop; run that way, it is a step of the
    enclosing saga and is undone with it (documented in the README)."""
    calls: list[str] = []
    undone: list[str] = []
    log = MemoryLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append(r)),
    )
    async def charge() -> str:
        calls.append("ch_1")
        return "ch_1"

    assert inspect.iscoroutinefunction(charge)
    with pytest.raises(RuntimeError, match="agent failed"), saga(log=log):
        assert asyncio.run(charge()) == "ch_1"
        raise RuntimeError("agent failed")
    assert calls == ["ch_1"]
    assert undone == ["ch_1"]
    assert len({r["saga"] for r in log.records}) == 1


def test_one_saga_block_cannot_be_entered_twice_at_once() -> None:
    block = saga(log=MemoryLog())
    with block:
        with pytest.raises(SagaUsageError):
            with block:
                pass


@pytest.mark.parametrize(
    "bad",
    [
        functools.partial(tool, semantics="compensable"),
        functools.partial(tool, semantics=ActionSemantics.IRREVERSIBLE, compensate=comp),
        functools.partial(tool, semantics=ActionSemantics.COMPENSABLE, snapshot=lambda: None),
        functools.partial(tool, semantics=ActionSemantics.REVERSIBLE, capture=lambda: None),
    ],
    ids=[
        "string-semantics",
        "irreversible-with-compensate",
        "snapshot-on-durable",
        "capture-on-reversible",
    ],
)
def test_inconsistent_tool_declarations_are_rejected_at_decoration(bad: typing.Any) -> None:
    with pytest.raises(SagaUsageError):
        bad()(charge_customer)


@pytest.mark.parametrize("decorator", [saga, tool], ids=["saga", "tool"])
def test_typed_overloads_accept_every_keyword_the_runtime_accepts(
    decorator: typing.Callable[..., typing.Any],
) -> None:
    """A ``mypy --strict`` user must be able to write ``saga(name="checkout", ...)``."""
    runtime = {
        p.name
        for p in inspect.signature(decorator).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    typed: set[str] = set()
    for overload in typing.get_overloads(decorator):
        typed |= {
            p.name
            for p in inspect.signature(overload).parameters.values()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        }
    assert sorted(runtime - typed) == []
