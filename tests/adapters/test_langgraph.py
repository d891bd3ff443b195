"""LangGraph specifics: LangChain call paths, parallel ToolNode calls, interrupt() approvals."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from adapter_handlers import (
    COMPENSABLE,
    IRREVERSIBLE,
    charge,
    compensate_charge,
    ledger,
    send_email,
)
from adapters_support import approval_story, records, runs_json
from drivers import driver
from scripted import Call, langgraph_model

from agent_saga import ActionSemantics, GateRefused, NoActiveSaga, saga
from agent_saga.adapters.langgraph import InterruptApprover, approve, deny, saga_run, wrap_tool

langchain_tools = pytest.importorskip("langchain_core.tools")
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from langgraph.types import Command  # noqa: E402

FW = driver("langgraph")


def _charges(op: str) -> list[str]:
    return [e["charge"] for e in ledger(op)]


def _wrapped_charge() -> Any:
    return wrap_tool(
        langchain_tools.tool(charge), semantics=COMPENSABLE, compensate=compensate_charge
    )


def test_invoke_in_a_sync_saga_is_a_step_undone_on_failure(wal: str) -> None:
    tool = _wrapped_charge()
    with pytest.raises(KeyError), saga("sync", wal_path=wal):
        assert tool.invoke({"charge_id": "ch_1"}) == "ch_1"
        message = tool.invoke(
            {"name": "charge", "args": {"charge_id": "ch_2"}, "id": "c9", "type": "tool_call"}
        )
        assert (message.content, message.tool_call_id) == ("ch_2", "c9")
        raise KeyError("the agent gave up")
    assert _charges("refund") == ["ch_2", "ch_1"]


async def test_ainvoke_of_sync_and_async_tools_in_an_async_saga_are_steps(wal: str) -> None:
    sync_tool = _wrapped_charge()

    async def acharge(charge_id: str) -> str:
        """Charge asynchronously."""
        return charge(charge_id)

    async_tool = wrap_tool(
        langchain_tools.tool(acharge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    with pytest.raises(KeyError):
        async with saga("async", wal_path=wal):
            assert await sync_tool.ainvoke({"charge_id": "ch_1"}) == "ch_1"
            assert await async_tool.ainvoke({"charge_id": "ch_2"}) == "ch_2"
            raise KeyError("the agent gave up")
    assert _charges("refund") == ["ch_2", "ch_1"]


def test_sync_graph_invoke_inside_a_sync_saga_unwinds_the_tool_node_calls(wal: str) -> None:
    tool = _wrapped_charge()
    model = langgraph_model(
        [
            [Call("charge", {"charge_id": "ch_1"})],
            [Call("charge", {"charge_id": "ch_2"})],
            OSError("down"),
        ]
    )
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    app = graph.compile()
    with pytest.raises(OSError, match="down"), saga("sync graph", wal_path=wal):
        app.invoke({"messages": [HumanMessage("go")]})
    assert _charges("refund") == ["ch_2", "ch_1"]


async def test_a_blocking_invoke_from_a_coroutine_runs_its_step_off_the_loop(wal: str) -> None:
    tool = _wrapped_charge()
    with pytest.raises(KeyError):
        async with saga("blocking", wal_path=wal):
            assert tool.invoke({"charge_id": "ch_1"}) == "ch_1"  # a sync call path
            raise KeyError("stop")
    assert _charges("refund") == ["ch_1"]


async def test_a_streamed_graph_run_inside_an_open_saga_is_unwound(wal: str) -> None:
    tool = _wrapped_charge()
    turns = [[Call("charge", {"charge_id": "ch_1"})], OSError("stream broke")]
    app = FW.target([tool], turns)
    seen = []
    with pytest.raises(OSError, match="stream broke"):
        async with saga("streamed", wal_path=wal):
            async for update in app.astream({"messages": [HumanMessage("go")]}):
                seen.extend(update)
    assert seen == ["model", "tools"]
    assert _charges("refund") == ["ch_1"]


async def test_a_reversible_tool_is_restored_from_its_snapshot_in_process(wal: str) -> None:
    cart: dict[str, int] = {}

    def add_to_cart(sku: str, qty: int) -> int:
        """Put an item in the cart."""
        cart[sku] = cart.get(sku, 0) + qty
        return cart[sku]

    def snapshot(sku: str, qty: int) -> Any:
        before = dict(cart)
        return lambda: (cart.clear(), cart.update(before))

    tool = wrap_tool(
        langchain_tools.tool(add_to_cart), semantics=ActionSemantics.REVERSIBLE, snapshot=snapshot
    )
    turns = [[Call("add_to_cart", {"sku": "sku-1", "qty": 2})], OSError("down")]
    with pytest.raises(OSError, match="down"):
        await FW.run(FW.target([tool], turns), wal_path=wal)
    assert cart == {}, "restored exactly"


def test_a_wrapped_tool_outside_any_saga_does_not_run(wal: str) -> None:
    tool = _wrapped_charge()
    with pytest.raises(NoActiveSaga, match="saga_run"):
        tool.invoke({"charge_id": "ch_1"})
    assert ledger() == []


def test_a_custom_base_tool_subclass_keeps_its_class_and_schema(wal: str) -> None:
    class Refunder(langchain_tools.BaseTool):
        name: str = "refunder"
        description: str = "Charge by hand."

        def _run(self, charge_id: str) -> str:
            return charge(charge_id)

    native = Refunder()
    tool = wrap_tool(native, semantics=COMPENSABLE, compensate=compensate_charge)
    assert isinstance(tool, Refunder)
    assert FW.view(tool) == FW.view(native)

    async def go() -> None:
        async with saga("custom", wal_path=wal):
            assert await tool.ainvoke({"charge_id": "ch_1"}) == "ch_1"
            raise KeyError("stop")

    with pytest.raises(KeyError):
        asyncio.run(go())
    assert _charges("refund") == ["ch_1"]
    assert runs_json(wal)[0]["steps"][0]["kwargs"] == {"charge_id": "ch_1"}


async def test_parallel_tool_calls_of_one_turn_unwind_in_reverse_completion_order(
    wal: str,
) -> None:
    # ch_1 finishes after ch_2, which finishes after ch_3: completion order 3, 2, 1.
    done = {name: asyncio.Event() for name in ("ch_1", "ch_2", "ch_3")}
    after = {"ch_1": "ch_2", "ch_2": "ch_3"}

    async def gated_charge(charge_id: str) -> str:
        """Charge once the charge it waits for is done."""
        if charge_id in after:
            await done[after[charge_id]].wait()
        result = charge(charge_id)
        done[charge_id].set()
        return result

    tool = wrap_tool(
        langchain_tools.tool(gated_charge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    turns = [
        [Call("gated_charge", {"charge_id": c}) for c in ("ch_1", "ch_2", "ch_3")],
        RuntimeError("the model crashed"),
    ]
    with pytest.raises(RuntimeError, match="crashed"):
        await FW.run(FW.target([tool], turns), wal_path=wal)
    assert _charges("charge") == ["ch_3", "ch_2", "ch_1"]
    assert _charges("refund") == ["ch_1", "ch_2", "ch_3"], "reverse completion order"
    (only,) = runs_json(wal)
    assert len(only["steps"]) == 3, "all three calls are steps of the one saga"


# --- interrupt() approvals ------------------------------------------------------------------


def _hitl_graph(turns: list[Any]) -> Any:
    tools = [
        _wrapped_charge(),
        wrap_tool(langchain_tools.tool(send_email), semantics=IRREVERSIBLE),
    ]
    model = langgraph_model(turns)

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


HITL_TURNS = [
    [Call("charge", {"charge_id": "ch_1"})],
    [Call("send_email", {"to": "a@example.com"})],
    "charged and told",
]


async def _paused(wal: str, thread: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    graph = _hitl_graph(HITL_TURNS)
    options = {"config": {"configurable": {"thread_id": thread}}}
    first = await saga_run(
        graph,
        {"messages": [HumanMessage("go")]},
        approver=InterruptApprover(),
        run_options=options,
        wal_path=wal,
    )
    (pending,) = first["__interrupt__"]
    assert ledger("email") == [], "paused before the IRREVERSIBLE call"
    return graph, options, pending.value


async def test_interrupt_approval_runs_the_exact_call_once(wal: str) -> None:
    graph, options, payload = await _paused(wal, "t1")
    assert (payload["tool"], payload["kwargs"]) == ("send_email", {"to": "a@example.com"})
    assert payload["tool_call_id"]
    assert payload["digest"].startswith("sha256:")
    result = await saga_run(
        graph,
        Command(resume=approve(payload, by="alice", note="customer asked")),
        approver=InterruptApprover(),
        run_options=options,
        wal_path=wal,
    )
    assert result["messages"][-1].content == "charged and told"
    assert [e["to"] for e in ledger("email")] == ["a@example.com"]
    (gate,) = records(wal, "gate")
    assert (gate["decision"], gate["decided_by"], gate["reason"]) == (
        "approved",
        "alice",
        "customer asked",
    )
    assert [s["outcome"] for s in runs_json(wal)] == ["committed", "committed"]
    # The same approval record as every other approver's: who, how, for which call.
    story = approval_story(wal)
    assert story["state"] == "approved by alice"
    assert story["asked"]["tool"] == "send_email"
    (decision,) = story["decisions"]
    assert (decision["by"], decision["note"]) == ("alice", "customer asked")
    assert decision["identity"] == {"how": "langgraph-interrupt", "name": "alice"}


async def test_interrupt_approval_does_not_apply_to_changed_arguments(wal: str) -> None:
    graph, options, payload = await _paused(wal, "t2")
    state = await graph.aget_state(options["config"])
    asked: AIMessage = state.values["messages"][-1]
    (call,) = asked.tool_calls
    forged = AIMessage(
        content="",
        id=asked.id,
        tool_calls=[{**call, "args": {"to": "attacker@example.com"}}],
    )
    await graph.aupdate_state(options["config"], {"messages": [forged]})
    with pytest.raises(GateRefused, match="digest mismatch"):
        await saga_run(
            graph,
            Command(resume=approve(payload, by="alice")),
            approver=InterruptApprover(),
            run_options=options,
            wal_path=wal,
        )
    assert ledger("email") == []


async def test_a_call_carrying_a_secret_is_refused_before_any_interrupt(wal: str) -> None:
    key = "sk_" + "live_" + secrets.token_hex(12)  # made up: looks like a Stripe key
    turns = [[Call("send_email", {"to": key})], "no"]
    graph = _hitl_graph(turns)
    options = {"config": {"configurable": {"thread_id": "t4"}}}
    with pytest.raises(GateRefused, match="secret"):
        await saga_run(
            graph,
            {"messages": [HumanMessage("go")]},
            approver=InterruptApprover(),
            run_options=options,
            wal_path=wal,
        )
    state = await graph.aget_state(options["config"])
    assert not state.interrupts, "the secret never reached the graph's state as a question"
    assert ledger("email") == []


async def test_interrupt_denial_refuses_the_call(wal: str) -> None:
    graph, options, payload = await _paused(wal, "t3")
    with pytest.raises(GateRefused, match="not today"):
        await saga_run(
            graph,
            Command(resume=deny(payload, by="bob", note="not today")),
            approver=InterruptApprover(),
            run_options=options,
            wal_path=wal,
        )
    assert ledger("email") == []
    (gate,) = records(wal, "gate")
    assert (gate["decision"], gate["decided_by"]) == ("refused", "bob")
