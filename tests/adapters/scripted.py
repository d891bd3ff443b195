"""Scripted offline models, one per framework: each emits the tool calls a script says.

A script is a list of turns, one per model call: a list of :class:`Call` (tool calls
in one turn — several are parallel calls), a string (the final answer), or an
exception instance (the model call raises it, so the run fails). A model asked
for more turns than its script has raises ``ScriptExhausted``.

Each framework is imported only by the function that builds its model.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SCRIPTS",
    "Call",
    "Script",
    "ScriptExhausted",
    "autogen_client",
    "crewai_llm",
    "langgraph_model",
    "llamaindex_llm",
    "openai_model",
]


class ScriptExhausted(AssertionError):
    """The framework asked the model for a turn the script does not have."""


@dataclass(frozen=True)
class Call:
    """One tool call the model makes."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


_ids = itertools.count(1)


#: Every script made in this process, newest last (a test reads what its model saw).
SCRIPTS: list[Script] = []


class Script:
    """The turns of one model, consumed in order; ``calls`` counts model calls.

    ``prompts`` holds, per model call, the text of what the framework sent the model
    (the tool results it reports included).
    """

    def __init__(self, turns: list[Any]) -> None:
        self.turns = list(turns)
        self.calls = 0
        self.prompts: list[str] = []
        SCRIPTS.append(self)

    def next(self, prompt: Any = None) -> Any:
        self.prompts.append(str(prompt))
        if self.calls >= len(self.turns):
            raise ScriptExhausted(
                f"the model was called {self.calls + 1} times; script: {self.turns}"
            )
        turn = self.turns[self.calls]
        self.calls += 1
        if isinstance(turn, BaseException):
            raise turn
        return turn


def _call_id() -> str:
    return f"call_{next(_ids)}"


# --- LangGraph / LangChain ------------------------------------------------------------

_LC_SCRIPTS: dict[str, Script] = {}


def langgraph_model(turns: list[Any]) -> Any:
    """A LangChain chat model playing ``turns`` (``bind_tools`` returns itself)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        script_id: str

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            turn = _LC_SCRIPTS[self.script_id].next([m.content for m in messages])
            if isinstance(turn, str):
                msg = AIMessage(content=turn)
            else:
                msg = AIMessage(
                    content="",
                    tool_calls=[
                        {"name": c.name, "args": c.args, "id": _call_id(), "type": "tool_call"}
                        for c in turn
                    ],
                )
            return ChatResult(generations=[ChatGeneration(message=msg)])

    sid = f"s{next(_ids)}"
    _LC_SCRIPTS[sid] = Script(turns)
    return ScriptedChatModel(script_id=sid)


# --- OpenAI Agents SDK ----------------------------------------------------------------


def openai_model(turns: list[Any]) -> Any:
    """An ``agents`` Model playing ``turns``."""
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    script = Script(turns)

    class ScriptedModel(Model):
        async def get_response(self, *args: Any, **kw: Any) -> Any:
            turn = script.next((args, kw))
            if isinstance(turn, str):
                output: list[Any] = [
                    ResponseOutputMessage(
                        id=f"m{next(_ids)}",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[ResponseOutputText(type="output_text", text=turn, annotations=[])],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id=_call_id(),
                        name=c.name,
                        arguments=json.dumps(c.args),
                        id=f"fc{next(_ids)}",
                        status="completed",
                    )
                    for c in turn
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kw: Any) -> Any:
            raise NotImplementedError

    model = ScriptedModel()
    model.script = script  # type: ignore[attr-defined]
    return model


# --- AutoGen ----------------------------------------------------------------------------


def autogen_client(turns: list[Any]) -> Any:
    """An AutoGen ``ReplayChatCompletionClient`` playing ``turns`` (exceptions: raised)."""
    from autogen_core import FunctionCall
    from autogen_core.models import CreateResult, ModelFamily, ModelInfo, RequestUsage
    from autogen_ext.models.replay import ReplayChatCompletionClient

    script = Script(turns)
    responses: list[Any] = []
    for turn in turns:
        if isinstance(turn, (str, BaseException)):
            responses.append("(exception)" if isinstance(turn, BaseException) else turn)
        else:
            responses.append(
                CreateResult(
                    finish_reason="function_calls",
                    content=[
                        FunctionCall(id=_call_id(), name=c.name, arguments=json.dumps(c.args))
                        for c in turn
                    ],
                    usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                    cached=False,
                )
            )

    class ScriptedClient(ReplayChatCompletionClient):
        async def create(self, *args: Any, **kw: Any) -> Any:
            script.next((args, kw))  # raises the scripted exception, or counts the turn
            return await super().create(*args, **kw)

    info = ModelInfo(
        vision=False,
        function_calling=True,
        json_output=False,
        family=ModelFamily.UNKNOWN,
        structured_output=False,
    )
    client = ScriptedClient(responses, model_info=info)
    client.script = script  # type: ignore[attr-defined]
    return client


# --- LlamaIndex ---------------------------------------------------------------------------


def llamaindex_llm(turns: list[Any]) -> Any:
    """A LlamaIndex function-calling mock LLM playing ``turns``."""
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    script = Script(turns)

    def respond(messages: Any, **kw: Any) -> Any:
        turn = script.next(messages)
        if isinstance(turn, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=turn)
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[
                ToolCallBlock(tool_call_id=_call_id(), tool_name=c.name, tool_kwargs=c.args)
                for c in turn
            ],
        )

    llm = MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)
    return llm, script


# --- CrewAI -------------------------------------------------------------------------------

_CREW_SCRIPTS: dict[str, Script] = {}


def crewai_llm(turns: list[Any]) -> Any:
    """A CrewAI LLM answering in ReAct text (the script lives outside the instance)."""
    from crewai.llms.base_llm import BaseLLM

    sid = f"crew{next(_ids)}"
    _CREW_SCRIPTS[sid] = Script(turns)

    class ScriptedLLM(BaseLLM):
        def call(
            self,
            messages: Any,
            tools: Any = None,
            callbacks: Any = None,
            available_functions: Any = None,
            from_task: Any = None,
            from_agent: Any = None,
            response_model: Any = None,
            **kw: Any,
        ) -> str:
            turn = _CREW_SCRIPTS[self.model.split(":", 1)[1]].next(messages)
            if isinstance(turn, str):
                return f"Thought: I now know the final answer\nFinal Answer: {turn}"
            (c,) = turn  # CrewAI's ReAct loop makes one call per turn
            return f"Thought: I must act\nAction: {c.name}\nAction Input: {json.dumps(c.args)}"

        def supports_function_calling(self) -> bool:
            return False

        def get_context_window_size(self) -> int:
            return 8192

    llm = ScriptedLLM(model=f"scripted:{sid}")
    return llm, _CREW_SCRIPTS[sid]
