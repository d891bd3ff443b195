"""One driver per framework: build its native tools and agent, run it through the adapter.

The contract tests (test_adapter_contract.py) are written once against this
interface and run for all five frameworks; each driver uses the framework's real
agent loop with a scripted offline model (scripted.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from scripted import (
    autogen_client,
    crewai_llm,
    langgraph_model,
    llamaindex_llm,
    openai_model,
)

__all__ = ["DRIVERS", "Driver", "driver"]


class Driver:
    """How the contract tests drive one framework."""

    name = ""
    module = ""
    #: Whether a tool's exception ends the run (LangGraph) instead of being told to the model.
    propagates_tool_errors = False
    #: Whether one model turn can hold several tool calls.
    parallel_calls = True

    @property
    def adapter(self) -> Any:
        return importlib.import_module(f"agent_saga.adapters.{self.module}")

    def native(self, fn: Callable[..., Any]) -> Any:
        """The framework's own tool for ``fn`` (as its users make one)."""
        raise NotImplementedError

    def view(self, tool: Any) -> tuple[Any, ...]:
        """Name, description and argument schema, as the framework shows them to a model."""
        raise NotImplementedError

    def wrap(self, native: Any, **kw: Any) -> Any:
        return self.adapter.wrap_tool(native, **kw)

    def target(self, tools: list[Any], turns: list[Any], *, carry_on: bool = False) -> Any:
        """The agent (graph, crew ...) that uses ``tools`` with a model playing ``turns``."""
        raise NotImplementedError

    def input(self) -> Any:
        return "please do it"

    async def run(self, target: Any, **options: Any) -> Any:
        return await self.adapter.saga_run(target, self.input(), **options)


class LangGraphDriver(Driver):
    name = module = "langgraph"
    propagates_tool_errors = True

    def native(self, fn: Callable[..., Any]) -> Any:
        from langchain_core.tools import tool

        return tool(fn)

    def view(self, tool: Any) -> tuple[Any, ...]:
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return (tool.name, tool.description, convert_to_openai_tool(tool))

    def target(self, tools: list[Any], turns: list[Any], *, carry_on: bool = False) -> Any:
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        model = langgraph_model(turns)

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", call_model)
        graph.add_node("tools", ToolNode(tools, handle_tool_errors=carry_on))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        return graph.compile()

    def input(self) -> Any:
        from langchain_core.messages import HumanMessage

        return {"messages": [HumanMessage("please do it")]}


class OpenAIAgentsDriver(Driver):
    name = "openai-agents"
    module = "openai_agents"

    def native(self, fn: Callable[..., Any]) -> Any:
        from agents import function_tool

        return function_tool(fn)

    def view(self, tool: Any) -> tuple[Any, ...]:
        return (tool.name, tool.description, tool.params_json_schema, tool.strict_json_schema)

    def target(self, tools: list[Any], turns: list[Any], *, carry_on: bool = False) -> Any:
        from agents import Agent

        return Agent(name="support", instructions="help", tools=tools, model=openai_model(turns))


class CrewAIDriver(Driver):
    name = module = "crewai"
    parallel_calls = False

    def native(self, fn: Callable[..., Any]) -> Any:
        from crewai.tools import tool

        return tool(fn.__name__)(fn)

    def view(self, tool: Any) -> tuple[Any, ...]:
        return (
            tool.name,
            tool.description,
            tool.args_schema.model_json_schema(),
            tool.to_structured_tool().args_schema.model_json_schema(),
        )

    def target(self, tools: list[Any], turns: list[Any], *, carry_on: bool = False) -> Any:
        from crewai import Agent, Crew, Task

        llm, _ = crewai_llm(turns)
        agent = Agent(
            role="support",
            goal="help the customer",
            backstory="a careful agent",
            tools=tools,
            llm=llm,
            max_retry_limit=0,
            verbose=False,
        )
        task = Task(
            description="do what the customer asks", expected_output="a summary", agent=agent
        )
        return Crew(agents=[agent], tasks=[task], verbose=False)

    def input(self) -> Any:
        return {}


class LlamaIndexDriver(Driver):
    name = module = "llamaindex"

    def native(self, fn: Callable[..., Any]) -> Any:
        from llama_index.core.tools import FunctionTool

        return FunctionTool.from_defaults(fn=fn)

    def view(self, tool: Any) -> tuple[Any, ...]:
        meta = tool.metadata
        return (
            meta.get_name(),
            meta.description,
            meta.get_parameters_dict(),
            meta.to_openai_tool(),
        )

    def target(self, tools: list[Any], turns: list[Any], *, carry_on: bool = False) -> Any:
        from llama_index.core.agent.workflow import FunctionAgent

        llm, _ = llamaindex_llm(turns)
        return FunctionAgent(tools=tools, llm=llm)


class AutoGenDriver(Driver):
    name = module = "autogen"

    def native(self, fn: Callable[..., Any]) -> Any:
        from autogen_core.tools import FunctionTool

        return FunctionTool(fn, description=(fn.__doc__ or "").strip().splitlines()[0])

    def view(self, tool: Any) -> tuple[Any, ...]:
        return (tool.name, tool.description, tool.schema)

    def target(self, tools: list[Any], turns: list[Any], *, carry_on: bool = False) -> Any:
        from autogen_agentchat.agents import AssistantAgent

        return AssistantAgent(
            "support", model_client=autogen_client(turns), tools=tools, max_tool_iterations=20
        )


DRIVERS: dict[str, Driver] = {
    d.name: d
    for d in (
        LangGraphDriver(),
        OpenAIAgentsDriver(),
        CrewAIDriver(),
        LlamaIndexDriver(),
        AutoGenDriver(),
    )
}


def driver(name: str) -> Driver:
    """The driver called ``name``."""
    return DRIVERS[name]
