"""LlamaIndex adapter (extra ``llamaindex``).

    from agent_saga.adapters.llamaindex import saga_run, wrap_tool

    refund = wrap_tool(FunctionTool.from_defaults(fn=refund),
                       semantics=ActionSemantics.COMPENSABLE, compensate=...)
    agent = FunctionAgent(tools=[refund], llm=llm)
    response = await saga_run(agent, "refund order 42")      # await agent.run(user_msg=...)

:func:`wrap_tool` returns a ``llama_index.core.tools.FunctionTool`` with the same
metadata (name, description, ``fn_schema``), callbacks and partial parameters, whose
``call``/``acall`` (and ``__call__``) run the step around the user's function. A
workflow ``Context`` parameter is passed through and never logged.

``agent.run(...)`` returns a handler that must be awaited while the saga is open:
:func:`saga_run` awaits it inside the saga. LlamaIndex's agents report a tool's
exception to the model and go on; the step records the call failed or UNKNOWN all
the same. A gate refusal reaches the model as a "refused: ..." message.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Final

from .._types import ActionSemantics
from ..errors import SagaUsageError
from ._common import (
    SagaStep,
    dress,
    refusal_message,
    require,
    resolved,
    run_as_saga,
    without_params,
)

require("llama_index.core", extra="llamaindex", adapter="llamaindex")

from llama_index.core.tools import FunctionTool  # noqa: E402

__all__ = ["saga_run", "wrap_tool"]

FRAMEWORK: Final = "llamaindex"


def wrap_tool(
    tool: FunctionTool,
    *,
    semantics: ActionSemantics,
    compensate: Any = None,
    **tool_options: Any,
) -> FunctionTool:
    """Make every call of a LlamaIndex function tool an agent-saga step.

    Args:
        tool: A ``FunctionTool`` (``FunctionTool.from_defaults(fn=...)``).
        semantics: How its side effect can be undone.
        compensate: Factory ``(result) -> Compensation`` (COMPENSABLE tools).
        **tool_options: ``@tool``'s other options.

    Returns:
        A ``FunctionTool`` with the same metadata.

    Raises:
        SagaUsageError: ``tool`` is not a ``FunctionTool``, is already wrapped, or an
            option is invalid.
    """
    if not isinstance(tool, FunctionTool):
        raise SagaUsageError(
            f"llamaindex.wrap_tool takes a llama_index.core.tools.FunctionTool, got "
            f"{type(tool).__name__}"
        )
    if getattr(tool, "__agent_saga_step__", None) is not None:
        raise SagaUsageError(f"tool {tool.metadata.name!r} is already wrapped by agent-saga")
    real = tool.real_fn
    hints = resolved(real)
    signature = inspect.signature(real)
    signature = signature.replace(
        parameters=[
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in signature.parameters.values()
        ]
    )
    ctx_name = tool.ctx_param_name
    visible = without_params(signature, [ctx_name] if ctx_name else [])
    step = SagaStep(
        framework=FRAMEWORK,
        name=tool.metadata.get_name(),
        signature=visible,
        semantics=semantics,
        compensate=compensate,
        options=tool_options,
        refusal=lambda exc: refusal_message(exc, semantics),
    )
    sync_fn, async_fn = tool._fn, tool._async_fn

    def logged(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items() if k != ctx_name}

    def call(*args: Any, **kwargs: Any) -> Any:
        return step.call_sync(lambda: sync_fn(*args, **kwargs), args, logged(kwargs))

    async def acall(*args: Any, **kwargs: Any) -> Any:
        return await step.call_async(lambda: async_fn(*args, **kwargs), args, logged(kwargs))

    for shim in (call, acall):
        dress(
            shim,
            name=getattr(real, "__name__", step.name),
            signature=signature,
            doc=getattr(real, "__doc__", None),
        )
    wrapped = FunctionTool(
        fn=call,
        async_fn=acall,
        metadata=tool.metadata,
        callback=tool._callback,
        async_callback=tool._async_callback,
        partial_params=dict(tool.partial_params),
    )
    wrapped.__agent_saga_step__ = step  # type: ignore[attr-defined]
    return wrapped


async def saga_run(
    target: Any,
    input: Any,
    *,
    run_options: Mapping[str, Any] | None = None,
    abort_on_tool_error: bool = False,
    **saga_options: Any,
) -> Any:
    """Run a LlamaIndex agent on ``input`` as one saga: ``await agent.run(user_msg=input)``.

    The handler ``run`` returns is awaited inside the saga, so every tool call of the
    run belongs to it.

    Args:
        target: A ``FunctionAgent``, ``ReActAgent`` or ``AgentWorkflow``.
        input: The user message.
        run_options: Keyword arguments for ``run`` (``ctx=``, ``chat_history=`` ...).
        abort_on_tool_error: A wrapped call that raised (the agent told the model and
            went on) refuses every later step and, once the run returns, is raised so
            the saga rolls back.
        **saga_options: ``saga(...)``'s options.

    Returns:
        The agent's output (``AgentOutput``).
    """
    if not callable(getattr(target, "run", None)):
        raise SagaUsageError(
            f"llamaindex.saga_run runs an agent or AgentWorkflow (anything with "
            f".run(user_msg=...)), got {type(target).__name__}"
        )
    options = dict(run_options or {})
    name = f"llamaindex:{getattr(target, 'name', None) or type(target).__name__}"

    async def start() -> Any:
        return await target.run(user_msg=input, **options)

    return await run_as_saga(
        FRAMEWORK, name, start, saga_options, abort_on_tool_error=abort_on_tool_error
    )
