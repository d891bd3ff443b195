"""LlamaIndex specifics: call/acall directly, the handler awaited inside the saga."""

from __future__ import annotations

import pytest
from adapter_handlers import COMPENSABLE, acharge, charge, compensate_charge, ledger
from adapters_support import runs_json
from scripted import Call, llamaindex_llm

from agent_saga import saga

llama_tools = pytest.importorskip("llama_index.core.tools")
from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.core.tools import FunctionTool, ToolOutput  # noqa: E402

from agent_saga.adapters.llamaindex import saga_run, wrap_tool  # noqa: E402


def _charges(op: str) -> list[str]:
    return [e["charge"] for e in ledger(op)]


def test_call_in_a_sync_saga_returns_a_tool_output_and_is_undone(wal: str) -> None:
    tool = wrap_tool(
        FunctionTool.from_defaults(fn=charge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    with pytest.raises(KeyError), saga("sync", wal_path=wal):
        output = tool.call(charge_id="ch_1")
        assert isinstance(output, ToolOutput)
        assert (output.content, output.raw_output) == ("ch_1", "ch_1")
        raise KeyError("stop")
    assert _charges("refund") == ["ch_1"]


async def test_acall_of_an_async_function_in_an_async_saga_is_undone(wal: str) -> None:
    tool = wrap_tool(
        FunctionTool.from_defaults(async_fn=acharge),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
    )
    with pytest.raises(KeyError):
        async with saga("async", wal_path=wal):
            output = await tool.acall(charge_id="ch_1", amount=5)
            assert output.raw_output == "ch_1"
            raise KeyError("stop")
    assert _charges("refund") == ["ch_1"]
    assert runs_json(wal)[0]["steps"][0]["kwargs"] == {"charge_id": "ch_1", "amount": 5}


async def test_every_tool_call_of_the_run_happens_inside_its_saga(wal: str) -> None:
    tool = wrap_tool(
        FunctionTool.from_defaults(fn=charge), semantics=COMPENSABLE, compensate=compensate_charge
    )
    llm, script = llamaindex_llm(
        [[Call("charge", {"charge_id": "ch_1"})], [Call("charge", {"charge_id": "ch_2"})], "ok"]
    )
    output = await saga_run(FunctionAgent(tools=[tool], llm=llm), "go", wal_path=wal)
    assert script.calls == 3
    assert "ok" in str(output)
    (only,) = runs_json(wal)
    assert only["outcome"] == "committed"
    assert len(only["steps"]) == 2, "no call ran after the saga ended"
