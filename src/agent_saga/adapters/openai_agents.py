"""OpenAI Agents SDK adapter (extra ``openai-agents``).

    from agent_saga.adapters.openai_agents import saga_run, wrap_tool

    refund = wrap_tool(refund, semantics=ActionSemantics.COMPENSABLE, compensate=...)
    agent = Agent(name="support", tools=[charge, refund])
    result = await saga_run(agent, "refund order 42")        # Runner.run(agent, input)

:func:`wrap_tool` returns an ``agents.FunctionTool`` (``dataclasses.replace`` of the
original: every field — name, description, ``params_json_schema``, strictness,
guardrails, timeouts, failure formatter — is kept) whose invoker runs the step.
The SDK turns a tool's exception into a message for the model; that is why the step
wraps the *function* ``function_tool`` was given (``tool.__wrapped__``), below the
SDK's error handling: a call that raised is recorded failed or UNKNOWN even though
the run goes on. A gate refusal reaches the model as a "refused: ..." message.

Human in the loop: :class:`ToolApprovals` is an approver that uses the SDK's own
tool approval. An IRREVERSIBLE wrapped tool then interrupts the run
(``result.interruptions``); ``approvals.approve(state, item, by=...)`` approves it in
the SDK's ``RunState`` *and* binds the approval to the call's exact arguments and
call id, and the resumed ``saga_run(agent, state, approver=approvals)`` runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from .._runtime import current_saga
from .._types import ActionSemantics
from ..errors import SagaUsageError
from ..gate import ApprovalRequest, Decision, current_user
from ._common import (
    CallId,
    SagaStep,
    approval_digest,
    refusal_message,
    require,
    resolved,
    run_as_saga,
    without_params,
)

require("agents", extra="openai-agents", adapter="openai_agents")

import contextvars  # noqa: E402

from agents import Agent, FunctionTool, Runner, function_tool  # noqa: E402
from agents.function_schema import function_schema  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["ToolApprovals", "saga_run", "wrap_tool"]

FRAMEWORK: Final = "openai_agents"

_CTX: contextvars.ContextVar[Any] = contextvars.ContextVar("agent_saga_openai_ctx", default=None)


def wrap_tool(
    tool: FunctionTool,
    *,
    semantics: ActionSemantics,
    compensate: Any = None,
    **tool_options: Any,
) -> FunctionTool:
    """Make every invocation of an Agents SDK function tool an agent-saga step.

    Args:
        tool: An ``agents.FunctionTool`` (from ``@function_tool`` or built by hand).
        semantics: How its side effect can be undone.
        compensate: Factory ``(result) -> Compensation`` (COMPENSABLE tools).
        **tool_options: ``@tool``'s other options.

    Returns:
        A ``FunctionTool`` with the same name, description and ``params_json_schema``.

    Raises:
        SagaUsageError: ``tool`` is not a ``FunctionTool``, is already wrapped, or an
            option is invalid.
    """
    if not isinstance(tool, FunctionTool):
        raise SagaUsageError(
            f"openai_agents.wrap_tool takes an agents.FunctionTool (from @function_tool), "
            f"got {type(tool).__name__}"
        )
    try:
        original = tool.__wrapped__
    except AttributeError:
        original = None
    for marked in (tool.on_invoke_tool, original):
        if getattr(marked, "__agent_saga_step__", None) is not None:
            raise SagaUsageError(f"tool {tool.name!r} is already wrapped by agent-saga")
    if original is None:
        invoker = _wrap_invoker(tool, semantics, compensate, tool_options)
    else:
        invoker = _wrap_function(tool, original, semantics, compensate, tool_options)
    wrapped = dataclasses.replace(tool, on_invoke_tool=invoker)
    if semantics is ActionSemantics.IRREVERSIBLE:
        wrapped.needs_approval = _needs_approval(tool.needs_approval)
    return wrapped


def _step(
    tool: FunctionTool,
    signature: inspect.Signature,
    semantics: ActionSemantics,
    compensate: Any,
    options: Mapping[str, Any],
) -> SagaStep:
    return SagaStep(
        framework=FRAMEWORK,
        name=tool.name,
        signature=signature,
        semantics=semantics,
        compensate=compensate,
        options=options,
        refusal=lambda exc: refusal_message(exc, semantics),
    )


def _wrap_function(
    tool: FunctionTool,
    original: Any,
    semantics: ActionSemantics,
    compensate: Any,
    options: Mapping[str, Any],
) -> Any:
    """Rebuild the SDK's invoker around a shim that runs ``original`` as the step."""
    takes_context = function_schema(original, name_override=tool.name).takes_context
    signature = inspect.signature(original)
    params = list(signature.parameters.values())
    visible = without_params(signature, [params[0].name]) if takes_context else signature
    step = _step(tool, visible, semantics, compensate, options)
    is_async = inspect.iscoroutinefunction(original)

    async def invoke(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        call_args = (ctx, *args) if takes_context else args

        def forward() -> Any:
            if is_async:
                return original(*call_args, **kwargs)
            return asyncio.to_thread(original, *call_args, **kwargs)

        token = _CTX.set(ctx)
        try:
            with CallId(getattr(ctx, "tool_call_id", None)):
                return await step.call_async(forward, args, kwargs)
        finally:
            _CTX.reset(token)

    # The SDK builds its argument parser from this signature: the original's
    # arguments, behind a context parameter (so the shim always gets the call id).
    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY)
    invoke.__signature__ = visible.replace(  # type: ignore[attr-defined]
        parameters=[ctx_param, *visible.parameters.values()]
    )
    hints = resolved(original)
    invoke.__annotations__ = {
        **{k: v for k, v in hints.items() if k in visible.parameters or k == "return"},
        "ctx": ToolContext[Any],
    }
    invoke.__name__ = invoke.__qualname__ = getattr(original, "__name__", tool.name)
    invoke.__doc__ = getattr(original, "__doc__", None)
    built = function_tool(
        invoke,
        name_override=tool.name,
        description_override=tool.description or None,
        strict_mode=tool.strict_json_schema,
    )
    invoke.__agent_saga_step__ = step  # type: ignore[attr-defined]
    return built.on_invoke_tool


def _wrap_invoker(
    tool: FunctionTool,
    semantics: ActionSemantics,
    compensate: Any,
    options: Mapping[str, Any],
) -> Any:
    """A hand-built FunctionTool: the step wraps its ``on_invoke_tool`` itself."""
    signature = inspect.Signature([inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    step = _step(tool, signature, semantics, compensate, options)
    original = tool.on_invoke_tool

    async def invoke(ctx: Any, input: str) -> Any:
        try:
            parsed = json.loads(input) if input else {}
        except ValueError:
            parsed = {"input": input}
        kwargs = parsed if isinstance(parsed, dict) else {"input": parsed}
        token = _CTX.set(ctx)
        try:
            with CallId(getattr(ctx, "tool_call_id", None)):
                return await step.call_async(lambda: original(ctx, input), (), kwargs)
        finally:
            _CTX.reset(token)

    invoke.__agent_saga_step__ = step  # type: ignore[attr-defined]
    return invoke


def _needs_approval(original: Any) -> Any:
    """The SDK asks for approval when the tool did, or when the saga's approver is ours."""

    async def needs_approval(run_context: Any, params: dict[str, Any], call_id: str) -> bool:
        if callable(original):
            verdict = original(run_context, params, call_id)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if verdict:
                return True
        elif original:
            return True
        scope = current_saga()
        return scope is not None and isinstance(scope.approver, ToolApprovals)

    return needs_approval


class ToolApprovals:
    """Approver using the SDK's tool approval, bound to each call's exact arguments.

    ``saga_run(agent, input, approver=approvals)`` makes the SDK interrupt the run at
    every IRREVERSIBLE wrapped tool (``result.interruptions``). Approve with
    :meth:`approve` — it calls ``state.approve(item)`` and records a digest of the
    call (tool, arguments, call id) — then resume with ``saga_run(agent, state,
    approver=approvals)``. The gate approves the step only if the SDK's state
    approved that call id *and* the call about to run has the approved digest.
    A rejection (:meth:`reject`) never reaches the tool: the SDK tells the model.

    Each paused run returned: its saga committed what ran before the interruption,
    and the resumed run is a new saga.

    Args:
        granted: Approvals given earlier (``approvals.granted``), e.g. when the run is
            resumed in another process.
        name: How this approver is named in the log when it refuses.
    """

    __slots__ = ("granted", "name")
    #: How its decisions are identified in the approval record (§12.3).
    identity_how: ClassVar[str] = "openai-agents"

    def __init__(
        self, granted: Mapping[str, Mapping[str, str]] | None = None, *, name: str = "sdk-approval"
    ) -> None:
        self.granted: dict[str, dict[str, str]] = {k: dict(v) for k, v in (granted or {}).items()}
        self.name = name

    def approve(self, state: Any, item: Any, *, by: str | None = None, note: str = "") -> str:
        """Approve one interruption in ``state`` and bind the approval to its call.

        Args:
            state: The ``RunState`` (``result.to_state()``).
            item: One of ``state.get_interruptions()`` / ``result.interruptions``.
            by: Who approves (default: the OS user).
            note: Why (recorded in the log).

        Returns:
            The approval's digest.
        """
        digest = _item_digest(item)
        state.approve(item)
        self.granted[digest] = {"by": by or current_user(), "note": note}
        return digest

    def reject(self, state: Any, item: Any) -> None:
        """Reject one interruption: the SDK tells the model, the tool does not run."""
        self.granted.pop(_item_digest(item), None)
        state.reject(item)

    def __call__(self, request: ApprovalRequest) -> Decision:
        """Approve ``request`` if the SDK approved this call and its digest was granted."""
        ctx = _CTX.get()
        if ctx is None:
            return Decision.deny(self.name, f"{request.tool!r} was not reached through the SDK")
        digest = _call_digest(ctx.tool_name, ctx.tool_arguments, ctx.tool_call_id)
        grant = self.granted.get(digest)
        if grant is None:
            return Decision.deny(
                self.name,
                f"no approval for this exact call of {request.tool!r} (its arguments or call "
                "id differ from what was approved, or nobody approved it)",
            )
        if ctx.is_tool_approved(ctx.tool_name, ctx.tool_call_id) is not True:
            return Decision.deny(self.name, "the SDK's run state does not approve this call")
        return Decision.approve(grant["by"], grant["note"] or "approved in the SDK run state")


def _call_digest(tool_name: str, arguments: str | None, call_id: str | None) -> str:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        parsed = {"raw": arguments}
    kwargs = parsed if isinstance(parsed, dict) else {"raw": parsed}
    return approval_digest(tool_name, kwargs, call_id)


def _item_digest(item: Any) -> str:
    raw = getattr(item, "raw_item", None)
    call_id = getattr(raw, "call_id", None)
    if call_id is None and isinstance(raw, dict):
        call_id = raw.get("call_id")
    name = getattr(item, "tool_name", None) or getattr(item, "name", None)
    if not isinstance(name, str):
        raise SagaUsageError("approve() takes an interruption of the run (a ToolApprovalItem)")
    return _call_digest(name, getattr(item, "arguments", None), call_id)


async def saga_run(
    target: Agent[Any],
    input: Any,
    *,
    run_options: Mapping[str, Any] | None = None,
    abort_on_tool_error: bool = False,
    **saga_options: Any,
) -> Any:
    """Run an Agents SDK agent on ``input`` as one saga: ``Runner.run(agent, input)``.

    Args:
        target: An ``agents.Agent`` (its handoffs and agents-as-tools run inside the
            same saga).
        input: A string, input items, or a ``RunState`` to resume.
        run_options: Keyword arguments for ``Runner.run`` (``context=``,
            ``max_turns=``, ``run_config=`` ...).
        abort_on_tool_error: A wrapped call that raised (the SDK told the model and
            went on) refuses every later step and, once the run returns, is raised
            so the saga rolls back.
        **saga_options: ``saga(...)``'s options.

    Returns:
        The SDK's ``RunResult``.
    """
    if not isinstance(target, Agent):
        raise SagaUsageError(
            f"openai_agents.saga_run runs an agents.Agent, got {type(target).__name__}"
        )
    options = dict(run_options or {})
    return await run_as_saga(
        FRAMEWORK,
        f"openai-agents:{target.name}",
        lambda: Runner.run(target, input, **options),
        saga_options,
        abort_on_tool_error=abort_on_tool_error,
    )
