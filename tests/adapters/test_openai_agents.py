"""OpenAI Agents SDK specifics: parallel calls, the SDK's own tool approval, hand-built tools."""

from __future__ import annotations

import asyncio
import json
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
from scripted import Call, openai_model

agents = pytest.importorskip("agents")
from agents import Agent, FunctionTool, RunContextWrapper, function_tool  # noqa: E402

from agent_saga import ActionSemantics  # noqa: E402
from agent_saga.adapters.openai_agents import ToolApprovals, saga_run, wrap_tool  # noqa: E402

FW = driver("openai-agents")


def _charges(op: str) -> list[str]:
    return [e["charge"] for e in ledger(op)]


async def test_parallel_tool_calls_of_one_turn_unwind_in_reverse_completion_order(
    wal: str,
) -> None:
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
        function_tool(gated_charge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    turns = [
        [Call("gated_charge", {"charge_id": c}) for c in ("ch_1", "ch_2", "ch_3")],
        RuntimeError("the model crashed"),
    ]
    with pytest.raises(RuntimeError, match="crashed"):
        await FW.run(FW.target([tool], turns), wal_path=wal)
    assert _charges("charge") == ["ch_3", "ch_2", "ch_1"]
    assert _charges("refund") == ["ch_1", "ch_2", "ch_3"], "reverse completion order"
    assert len(runs_json(wal)[0]["steps"]) == 3


async def test_a_parallel_call_still_in_flight_when_a_sibling_fails_is_undone_by_its_result(
    wal: str,
) -> None:
    """The SDK runs one turn's calls concurrently; when one raises, the run fails while
    the other is still in flight. Its charge lands (the provider accepted it), so the
    rollback waits for it and refunds it from its result — not cancelled, escalated
    or forgotten."""
    charging, sibling_failed = asyncio.Event(), asyncio.Event()

    async def slow_charge(charge_id: str) -> str:
        """Charge; the provider answers only after the sibling call failed."""
        charging.set()
        await sibling_failed.wait()
        # A slow provider: the run's failure reaches the saga meanwhile. (The rollback
        # waits for the call whatever this takes; the pause only makes sure that a
        # rollback that did not wait would be seen not waiting.)
        await asyncio.sleep(0.3)
        return charge(charge_id)

    async def fail_lookup(charge_id: str) -> str:
        """A tool whose error is not handed back to the model: it ends the run."""
        await charging.wait()  # the charge is in flight
        asyncio.get_running_loop().call_soon(sibling_failed.set)
        raise LookupError("the CRM is down")

    tools = [
        wrap_tool(function_tool(slow_charge), semantics=COMPENSABLE, compensate=compensate_charge),
        wrap_tool(
            function_tool(fail_lookup, failure_error_function=None),
            semantics=ActionSemantics.REVERSIBLE,
        ),
    ]
    turns = [[Call("slow_charge", {"charge_id": "ch_1"}), Call("fail_lookup", {"charge_id": "x"})]]
    with pytest.raises(Exception, match="CRM is down"):
        await FW.run(FW.target(tools, turns), wal_path=wal)
    assert _charges("charge") == ["ch_1"]
    assert _charges("refund") == ["ch_1"]
    [run] = runs_json(wal)
    assert run["outcome"] == "rolled_back"
    assert run["escalations"] == []


def _approval_agent() -> Agent[Any]:
    tools = [
        wrap_tool(function_tool(charge), semantics=COMPENSABLE, compensate=compensate_charge),
        wrap_tool(function_tool(send_email), semantics=IRREVERSIBLE),
    ]
    turns = [
        [Call("charge", {"charge_id": "ch_1"})],
        [Call("send_email", {"to": "a@example.com"})],
        "charged and told",
    ]
    return Agent(name="support", tools=tools, model=openai_model(turns))


async def _interrupted(wal: str, approvals: ToolApprovals) -> tuple[Agent[Any], Any]:
    agent = _approval_agent()
    first = await saga_run(agent, "go", approver=approvals, wal_path=wal)
    (item,) = first.interruptions
    assert item.tool_name == "send_email"
    assert ledger("email") == [], "the SDK paused before the IRREVERSIBLE call"
    return agent, first.to_state()


async def test_sdk_approval_runs_the_approved_call_once(wal: str) -> None:
    approvals = ToolApprovals()
    agent, state = await _interrupted(wal, approvals)
    (item,) = state.get_interruptions()
    approvals.approve(state, item, by="alice", note="customer asked")
    result = await saga_run(agent, state, approver=approvals, wal_path=wal)
    assert result.final_output == "charged and told"
    assert [e["to"] for e in ledger("email")] == ["a@example.com"]
    (gate,) = records(wal, "gate")
    assert (gate["decision"], gate["decided_by"], gate["reason"]) == (
        "approved",
        "alice",
        "customer asked",
    )
    # The same approval record as every other approver's: who, how, for which call.
    story = approval_story(wal)
    assert story["state"] == "approved by alice"
    assert story["asked"]["tool"] == "send_email"
    (decision,) = story["decisions"]
    assert (decision["by"], decision["note"]) == ("alice", "customer asked")
    assert decision["identity"] == {"how": "openai-agents", "name": "alice"}


async def test_sdk_approval_does_not_extend_to_a_call_with_other_arguments(wal: str) -> None:
    # The SDK's "always approve" lets every later call of the tool through; the gate
    # still runs only the exact call a human approved.
    approvals = ToolApprovals()
    tools = [wrap_tool(function_tool(send_email), semantics=IRREVERSIBLE)]
    turns = [
        [Call("send_email", {"to": "a@example.com"})],
        [Call("send_email", {"to": "attacker@example.com"})],
        "done",
    ]
    agent = Agent(name="support", tools=tools, model=openai_model(turns))
    first = await saga_run(agent, "go", approver=approvals, wal_path=wal)
    state = first.to_state()
    (item,) = state.get_interruptions()
    state.approve(item, always_approve=True)
    approvals.approve(state, item, by="alice")
    result = await saga_run(agent, state, approver=approvals, wal_path=wal)
    assert [e["to"] for e in ledger("email")] == ["a@example.com"]
    outputs = [str(getattr(i, "output", "")) for i in result.new_items]
    assert any(o.startswith("refused: needs human approval (tool send_email)") for o in outputs)
    approved, refused = records(wal, "gate")
    assert (approved["decision"], approved["decided_by"]) == ("approved", "alice")
    assert refused["decision"] == "refused"
    assert "arguments or call id differ" in refused["reason"]


async def test_sdk_rejection_never_reaches_the_tool(wal: str) -> None:
    approvals = ToolApprovals()
    agent, state = await _interrupted(wal, approvals)
    (item,) = state.get_interruptions()
    approvals.reject(state, item)
    await saga_run(agent, state, approver=approvals, wal_path=wal)
    assert ledger("email") == []
    assert records(wal, "intent")[-1]["tool"] == "charge", "no step for the rejected call"


async def test_a_hand_built_function_tool_is_wrapped_at_its_invoker(wal: str) -> None:
    async def invoke(ctx: Any, arguments: str) -> str:
        return charge(json.loads(arguments)["charge_id"])

    native = FunctionTool(
        name="charge",
        description="Charge by hand.",
        params_json_schema={
            "type": "object",
            "properties": {"charge_id": {"type": "string"}},
            "required": ["charge_id"],
            "additionalProperties": False,
        },
        on_invoke_tool=invoke,
    )
    tool = wrap_tool(native, semantics=COMPENSABLE, compensate=compensate_charge)
    assert FW.view(tool) == FW.view(native)
    turns = [[Call("charge", {"charge_id": "ch_1"})], OSError("down")]
    with pytest.raises(OSError, match="down"):
        await FW.run(FW.target([tool], turns), wal_path=wal)
    assert _charges("refund") == ["ch_1"]
    assert runs_json(wal)[0]["steps"][0]["kwargs"] == {"charge_id": "ch_1"}


async def test_a_tool_taking_the_run_context_gets_it_and_the_log_does_not(wal: str) -> None:
    seen: list[Any] = []

    def charge_for(ctx: RunContextWrapper[Any], charge_id: str) -> str:
        """Charge for the run's customer."""
        seen.append(ctx.context)
        return charge(charge_id)

    tool = wrap_tool(function_tool(charge_for), semantics=COMPENSABLE, compensate=compensate_charge)
    agent = Agent(
        name="support",
        tools=[tool],
        model=openai_model([[Call("charge_for", {"charge_id": "ch_1"})], "ok"]),
    )
    await saga_run(agent, "go", run_options={"context": {"customer": "cus_1"}}, wal_path=wal)
    assert seen == [{"customer": "cus_1"}]
    assert runs_json(wal)[0]["steps"][0]["kwargs"] == {"charge_id": "ch_1"}
