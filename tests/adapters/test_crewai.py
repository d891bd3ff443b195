"""CrewAI specifics: run/arun directly, BaseTool subclasses, retried calls are steps."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_handlers import COMPENSABLE, acharge, charge, compensate_charge, ledger
from adapters_support import runs_json
from drivers import driver
from scripted import Call

from agent_saga import saga

FW = driver("crewai")


# crewai writes under $HOME when it is imported: only import it inside a test, once
# the autouse fixture pointed $HOME at the test's own directory.
@pytest.fixture
def crewai_tools() -> Any:
    import crewai.tools

    return crewai.tools


@pytest.fixture
def wrap_tool() -> Any:
    from agent_saga.adapters.crewai import wrap_tool

    return wrap_tool


def _charges(op: str) -> list[str]:
    return [e["charge"] for e in ledger(op)]


def test_run_in_a_sync_saga_is_a_step_undone_on_failure(
    wal: str, crewai_tools: Any, wrap_tool: Any
) -> None:
    tool = wrap_tool(
        crewai_tools.tool("charge")(charge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    with pytest.raises(KeyError), saga("sync", wal_path=wal):
        assert tool.run(charge_id="ch_1") == "ch_1"
        raise KeyError("stop")
    assert _charges("refund") == ["ch_1"]


async def test_arun_of_an_async_tool_in_an_async_saga_is_undone(
    wal: str, crewai_tools: Any, wrap_tool: Any
) -> None:
    tool = wrap_tool(
        crewai_tools.tool("acharge")(acharge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    with pytest.raises(KeyError):
        async with saga("async", wal_path=wal):
            assert await tool.arun(charge_id="ch_1") == "ch_1"
            raise KeyError("stop")
    assert _charges("refund") == ["ch_1"]


async def test_a_base_tool_subclass_runs_its_steps_inside_a_crew(
    wal: str, crewai_tools: Any, wrap_tool: Any
) -> None:
    from pydantic import BaseModel

    class ChargeArgs(BaseModel):
        charge_id: str

    class ChargeTool(crewai_tools.BaseTool):  # type: ignore[misc]
        name: str = "charge"
        description: str = "Charge a card."
        args_schema: type[BaseModel] = ChargeArgs

        def _run(self, charge_id: str) -> str:
            return charge(charge_id)

    native = ChargeTool()
    tool = wrap_tool(native, semantics=COMPENSABLE, compensate=compensate_charge)
    assert isinstance(tool, ChargeTool)
    assert FW.view(tool) == FW.view(native)
    turns = [[Call("charge", {"charge_id": "ch_1"})], RuntimeError("the model crashed")]
    with pytest.raises(RuntimeError, match="crashed"):
        await FW.run(FW.target([tool], turns), wal_path=wal)
    assert _charges("refund") == ["ch_1"]


async def test_each_attempt_crewai_retries_is_its_own_step(
    wal: str, crewai_tools: Any, wrap_tool: Any
) -> None:
    tool = wrap_tool(
        crewai_tools.tool("charge")(charge),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
        no_effect_on=(ValueError,),
    )
    turns = [[Call("charge", {"charge_id": "bad_1"})], "gave up"]
    await FW.run(FW.target([tool], turns), wal_path=wal)
    steps = runs_json(wal)[0]["steps"]
    assert len(steps) > 1, "CrewAI retried the failing call"
    assert {s["state"] for s in steps} == {"no_effect"}
