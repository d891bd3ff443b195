"""AutoGen specifics: run_json called directly, teams, the cancellation token."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from adapter_handlers import COMPENSABLE, charge, compensate_charge, ledger
from adapters_support import runs_json
from scripted import Call, autogen_client

from agent_saga import saga

autogen_core = pytest.importorskip("autogen_core")
from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.conditions import MaxMessageTermination  # noqa: E402
from autogen_agentchat.teams import RoundRobinGroupChat  # noqa: E402
from autogen_core import CancellationToken  # noqa: E402
from autogen_core.tools import FunctionTool  # noqa: E402

from agent_saga.adapters.autogen import saga_run, wrap_tool  # noqa: E402


def _charges(op: str) -> list[str]:
    return [e["charge"] for e in ledger(op)]


def _tool() -> Any:
    return wrap_tool(
        FunctionTool(charge, description="Charge a card."),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
    )


async def test_run_json_of_a_sync_function_is_a_step_started_on_the_loop(wal: str) -> None:
    # AutoGen runs sync functions in an executor that drops context variables; the
    # step starts on the loop, so it still belongs to the saga.
    tool = _tool()
    with pytest.raises(KeyError):
        async with saga("direct", wal_path=wal):
            assert await tool.run_json({"charge_id": "ch_1"}, CancellationToken()) == "ch_1"
            raise KeyError("stop")
    assert _charges("refund") == ["ch_1"]


async def test_a_team_run_is_one_saga_and_its_failure_unwinds_it(wal: str) -> None:
    agent = AssistantAgent(
        "support",
        model_client=autogen_client(
            [[Call("charge", {"charge_id": "ch_1"})], RuntimeError("the model crashed")]
        ),
        tools=[_tool()],
        max_tool_iterations=5,
    )
    team = RoundRobinGroupChat([agent], termination_condition=MaxMessageTermination(6))
    with pytest.raises(RuntimeError, match="the model crashed"):
        await saga_run(team, "go", wal_path=wal)
    assert _charges("refund") == ["ch_1"]
    (only,) = runs_json(wal)
    assert only["name"] == "autogen:RoundRobinGroupChat"


async def test_a_tool_that_takes_the_cancellation_token_gets_it_unlogged(wal: str) -> None:
    seen: list[Any] = []

    async def charge_cancellable(charge_id: str, cancellation_token: CancellationToken) -> str:
        seen.append(cancellation_token)
        return charge(charge_id)

    tool = wrap_tool(
        FunctionTool(charge_cancellable, description="Charge."),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
    )
    token = CancellationToken()
    async with saga("token", wal_path=wal):
        await tool.run_json({"charge_id": "ch_1"}, token)
    assert seen == [token]
    assert runs_json(wal)[0]["steps"][0]["kwargs"] == {"charge_id": "ch_1"}


async def test_parallel_tool_calls_of_one_turn_unwind_in_reverse_completion_order(
    wal: str,
) -> None:
    done = {name: asyncio.Event() for name in ("ch_1", "ch_2", "ch_3")}
    after = {"ch_1": "ch_2", "ch_2": "ch_3"}

    async def gated_charge(charge_id: str) -> str:
        if charge_id in after:
            await done[after[charge_id]].wait()
        result = charge(charge_id)
        done[charge_id].set()
        return result

    tool = wrap_tool(
        FunctionTool(gated_charge, description="Charge once the charge it waits for is done."),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
    )
    turns = [
        [Call("gated_charge", {"charge_id": c}) for c in ("ch_1", "ch_2", "ch_3")],
        RuntimeError("the model crashed"),
    ]
    agent = AssistantAgent(
        "support", model_client=autogen_client(turns), tools=[tool], max_tool_iterations=5
    )
    with pytest.raises(RuntimeError, match="crashed"):
        await saga_run(agent, "go", wal_path=wal)
    assert _charges("charge") == ["ch_3", "ch_2", "ch_1"]
    assert _charges("refund") == ["ch_1", "ch_2", "ch_3"], "reverse completion order"
