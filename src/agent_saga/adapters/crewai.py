"""CrewAI adapter (extra ``crewai``).

    from agent_saga.adapters.crewai import saga_run, wrap_tool

    refund = wrap_tool(refund, semantics=ActionSemantics.COMPENSABLE, compensate=...)
    crew = Crew(agents=[Agent(..., tools=[refund])], tasks=[...])
    output = await saga_run(crew, {"order": "42"})           # crew.kickoff_async(inputs=...)

:func:`wrap_tool` returns a tool of the original's class with the same name,
description and ``args_schema``: a ``Tool`` (what ``@tool`` makes) gets its ``func``
replaced, any other ``BaseTool`` becomes an instance of a subclass whose ``_run`` /
``_arun`` run the step; ``run``, ``arun`` and the structured tool CrewAI builds from
it all go through there.

CrewAI reports a tool's exception to the model — after retrying the call itself, so
each retry is another step — and goes on; every attempt is recorded failed or
UNKNOWN. A gate refusal is *returned* as a "refused: ..." message, so CrewAI does
not retry it. ``Crew.kickoff()`` cannot run inside an event loop: :func:`saga_run`
uses ``kickoff_async`` (which runs the crew in a worker thread that carries the
saga's context).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import Any, Final

from .._types import ActionSemantics
from ..errors import SagaUsageError
from ._common import SagaStep, fields_signature, refusal_message, require, run_as_saga

require("crewai", extra="crewai", adapter="crewai")

from crewai import Crew  # noqa: E402
from crewai.tools import BaseTool  # noqa: E402
from crewai.tools.base_tool import Tool  # noqa: E402

__all__ = ["saga_run", "wrap_tool"]

FRAMEWORK: Final = "crewai"


def wrap_tool(
    tool: BaseTool,
    *,
    semantics: ActionSemantics,
    compensate: Any = None,
    **tool_options: Any,
) -> BaseTool:
    """Make every call of a CrewAI tool an agent-saga step.

    Args:
        tool: A CrewAI tool (``@crewai.tools.tool``, or a ``BaseTool`` subclass).
        semantics: How its side effect can be undone.
        compensate: Factory ``(result) -> Compensation`` (COMPENSABLE tools).
        **tool_options: ``@tool``'s other options.

    Returns:
        A tool of ``tool``'s class with the same name, description and args schema.

    Raises:
        SagaUsageError: ``tool`` is not a CrewAI tool, is already wrapped, or an
            option is invalid.
    """
    if not isinstance(tool, BaseTool):
        raise SagaUsageError(
            f"crewai.wrap_tool takes a CrewAI tool (crewai.tools.BaseTool), got "
            f"{type(tool).__name__}"
        )
    if getattr(type(tool), "__agent_saga_step__", None) is not None or getattr(
        getattr(tool, "func", None), "__agent_saga_step__", None
    ):
        raise SagaUsageError(f"tool {tool.name!r} is already wrapped by agent-saga")
    signature = fields_signature(tool.args_schema)
    step = SagaStep(
        framework=FRAMEWORK,
        name=tool.name,
        signature=signature,
        semantics=semantics,
        compensate=compensate,
        options=tool_options,
        refusal=lambda exc: refusal_message(exc, semantics),
    )
    if isinstance(tool, Tool):
        return tool.model_copy(update={"func": _shim(tool.func, step)})
    return _subclassed(tool, step)


def _shim(func: Any, step: SagaStep) -> Any:
    if inspect.iscoroutinefunction(func):

        async def async_shim(*args: Any, **kwargs: Any) -> Any:
            return await step.call_async(lambda: func(*args, **kwargs), args, kwargs)

        shim: Any = async_shim
    else:

        def sync_shim(*args: Any, **kwargs: Any) -> Any:
            return step.call_sync(lambda: func(*args, **kwargs), args, kwargs)

        shim = sync_shim
    with contextlib.suppress(TypeError, ValueError):  # a builtin has none: keep the shim's
        shim.__signature__ = inspect.signature(func)
    shim.__name__ = shim.__qualname__ = getattr(func, "__name__", step.name)
    shim.__doc__ = getattr(func, "__doc__", None)
    shim.__agent_saga_step__ = step
    return shim


def _subclassed(tool: BaseTool, step: SagaStep) -> BaseTool:
    base = type(tool)

    def _run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return step.call_sync(lambda: base._run(self, *args, **kwargs), args, kwargs)

    async def _arun(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await step.call_async(lambda: base._arun(self, *args, **kwargs), args, kwargs)

    subclass = type(
        base.__name__,
        (base,),
        {
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__agent_saga_step__": step,
            "_run": _run,
            "_arun": _arun,
        },
    )
    wrapped = tool.model_copy()
    wrapped.__class__ = subclass
    return wrapped


async def saga_run(
    target: Crew,
    input: Mapping[str, Any] | None,
    *,
    run_options: Mapping[str, Any] | None = None,
    abort_on_tool_error: bool = False,
    **saga_options: Any,
) -> Any:
    """Run a crew on ``input`` as one saga: ``await crew.kickoff_async(inputs=input)``.

    Args:
        target: A ``Crew``.
        input: The crew's inputs (interpolated into tasks), or None.
        run_options: Other keyword arguments for ``kickoff_async``.
        abort_on_tool_error: A wrapped call that raised (CrewAI told the model and
            went on) refuses every later step and, once the crew finishes, is raised
            so the saga rolls back.
        **saga_options: ``saga(...)``'s options.

    Returns:
        CrewAI's ``CrewOutput``.
    """
    if not isinstance(target, Crew):
        raise SagaUsageError(f"crewai.saga_run runs a crewai.Crew, got {type(target).__name__}")
    options = dict(run_options or {})
    name = f"crewai:{getattr(target, 'name', None) or 'crew'}"
    return await run_as_saga(
        FRAMEWORK,
        name,
        lambda: target.kickoff_async(inputs=dict(input or {}), **options),
        saga_options,
        abort_on_tool_error=abort_on_tool_error,
    )
