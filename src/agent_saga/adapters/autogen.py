"""AutoGen (``autogen-agentchat`` 0.7) adapter (extra ``autogen``).

    from agent_saga.adapters.autogen import saga_run, wrap_tool

    refund = wrap_tool(FunctionTool(refund, description="..."),
                       semantics=ActionSemantics.COMPENSABLE, compensate=...)
    agent = AssistantAgent("support", model_client=client, tools=[refund])
    result = await saga_run(agent, "refund order 42")        # agent.run(task=input)

:func:`wrap_tool` returns an ``autogen_core.tools.FunctionTool`` with the same name,
description and schema (for another ``BaseTool``, a subclass of its class) whose
``run_json``/``run`` runs the step. The step starts on the event loop: AutoGen runs a
sync function in an executor that does not carry context variables, so a step started
there would find no saga; the function itself still runs in a worker thread.

AutoGen reports a tool's exception to the model (``FunctionExecutionResult(
is_error=True)``) and goes on; the step records the call failed or UNKNOWN all the
same. A gate refusal reaches the model as a "refused: ..." message.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any, Final

from .._types import ActionSemantics
from ..errors import SagaUsageError
from ._common import (
    SagaStep,
    fields_signature,
    refusal_message,
    require,
    resolved,
    run_as_saga,
    without_params,
)

require("autogen_core", extra="autogen", adapter="autogen")
require("autogen_agentchat", extra="autogen", adapter="autogen")

from autogen_core.tools import BaseTool, FunctionTool  # noqa: E402

__all__ = ["saga_run", "wrap_tool"]

FRAMEWORK: Final = "autogen"
_TOKEN = "cancellation_token"  # noqa: S105 - a parameter name


def wrap_tool(
    tool: BaseTool[Any, Any],
    *,
    semantics: ActionSemantics,
    compensate: Any = None,
    **tool_options: Any,
) -> BaseTool[Any, Any]:
    """Make every call of an AutoGen tool an agent-saga step.

    Args:
        tool: An ``autogen_core.tools.FunctionTool`` (or another ``BaseTool``).
        semantics: How its side effect can be undone.
        compensate: Factory ``(result) -> Compensation`` (COMPENSABLE tools).
        **tool_options: ``@tool``'s other options.

    Returns:
        A tool of the same kind with the same name, description and schema.

    Raises:
        SagaUsageError: ``tool`` is not an AutoGen tool, is already wrapped, or an
            option is invalid.
    """
    if not isinstance(tool, BaseTool):
        raise SagaUsageError(
            f"autogen.wrap_tool takes an autogen_core.tools tool (FunctionTool), got "
            f"{type(tool).__name__}"
        )
    if getattr(tool, "__agent_saga_step__", None) is not None:
        raise SagaUsageError(f"tool {tool.name!r} is already wrapped by agent-saga")
    if isinstance(tool, FunctionTool):
        return _wrap_function_tool(tool, semantics, compensate, tool_options)
    return _wrap_base_tool(tool, semantics, compensate, tool_options)


def _step(
    name: str,
    signature: inspect.Signature,
    semantics: ActionSemantics,
    compensate: Any,
    options: Mapping[str, Any],
) -> SagaStep:
    return SagaStep(
        framework=FRAMEWORK,
        name=name,
        signature=signature,
        semantics=semantics,
        compensate=compensate,
        options=options,
        refusal=lambda exc: refusal_message(exc, semantics),
    )


def _wrap_function_tool(
    tool: FunctionTool,
    semantics: ActionSemantics,
    compensate: Any,
    options: Mapping[str, Any],
) -> FunctionTool:
    original = tool._func
    signature = tool._signature  # typed, as AutoGen built the args model from it
    takes_token = _TOKEN in signature.parameters
    step = _step(tool.name, without_params(signature, [_TOKEN]), semantics, compensate, options)
    is_async = inspect.iscoroutinefunction(original)

    async def invoke(**kwargs: Any) -> Any:
        token = kwargs.pop(_TOKEN, None)
        call_kwargs = {**kwargs, _TOKEN: token} if takes_token else kwargs

        def forward() -> Any:
            if is_async:
                return original(**call_kwargs)
            return asyncio.to_thread(original, **call_kwargs)

        return await step.call_async(forward, (), kwargs)

    invoke.__signature__ = signature  # type: ignore[attr-defined]
    invoke.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()} | {
        "return": signature.return_annotation
    }
    invoke.__name__ = invoke.__qualname__ = getattr(original, "__name__", tool.name)
    invoke.__doc__ = getattr(original, "__doc__", None)
    if not resolved(invoke):  # pragma: no cover - defensive: AutoGen needs the hints
        raise SagaUsageError(f"cannot read the type hints of {tool.name!r}")
    wrapped = FunctionTool(
        invoke,
        description=tool.description,
        name=tool.name,
        global_imports=tool._global_imports,
        strict=tool._strict,
    )
    wrapped.__agent_saga_step__ = step  # type: ignore[attr-defined]
    return wrapped


def _wrap_base_tool(
    tool: BaseTool[Any, Any],
    semantics: ActionSemantics,
    compensate: Any,
    options: Mapping[str, Any],
) -> BaseTool[Any, Any]:
    base = type(tool)
    signature = fields_signature(tool.args_type())
    step = _step(tool.name, signature, semantics, compensate, options)

    async def run(self: Any, args: Any, cancellation_token: Any) -> Any:
        kwargs = args.model_dump() if hasattr(args, "model_dump") else dict(args)
        return await step.call_async(lambda: base.run(self, args, cancellation_token), (), kwargs)

    subclass = type(
        base.__name__,
        (base,),
        {"__module__": base.__module__, "__qualname__": base.__qualname__, "run": run},
    )
    wrapped: BaseTool[Any, Any] = _copy_as(tool, subclass)
    wrapped.__agent_saga_step__ = step  # type: ignore[attr-defined]
    return wrapped


def _copy_as(tool: Any, cls: type[Any]) -> Any:
    import copy

    clone = copy.copy(tool)
    clone.__class__ = cls
    return clone


async def saga_run(
    target: Any,
    input: Any,
    *,
    run_options: Mapping[str, Any] | None = None,
    abort_on_tool_error: bool = False,
    **saga_options: Any,
) -> Any:
    """Run an AutoGen agent or team on ``input`` as one saga: ``target.run(task=input)``.

    Args:
        target: An ``AssistantAgent``, or a team (``RoundRobinGroupChat`` ...).
        input: The task (a string or messages).
        run_options: Keyword arguments for ``run`` (``cancellation_token=`` ...).
        abort_on_tool_error: A wrapped call that raised (AutoGen told the model and
            went on) refuses every later step and, once the run returns, is raised
            so the saga rolls back.
        **saga_options: ``saga(...)``'s options.

    Returns:
        AutoGen's ``TaskResult``.
    """
    if not callable(getattr(target, "run", None)):
        raise SagaUsageError(
            f"autogen.saga_run runs an agent or a team (anything with .run(task=...)), got "
            f"{type(target).__name__}"
        )
    options = dict(run_options or {})
    name = f"autogen:{getattr(target, 'name', None) or type(target).__name__}"
    return await run_as_saga(
        FRAMEWORK,
        name,
        lambda: target.run(task=input, **options),
        saga_options,
        abort_on_tool_error=abort_on_tool_error,
    )
