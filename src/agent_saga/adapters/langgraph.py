"""LangGraph / LangChain adapter (extra ``langgraph``).

    from agent_saga.adapters.langgraph import saga_run, wrap_tool

    refund = wrap_tool(refund, semantics=ActionSemantics.COMPENSABLE, compensate=...)
    graph = create_react_agent(model, [charge, refund])      # or your own StateGraph
    result = await saga_run(graph, {"messages": [...]})     # one graph run = one saga

:func:`wrap_tool` returns a tool of the original tool's class (a subclass made for
this one tool, so ``isinstance`` checks, the ToolNode and tracing see a
``StructuredTool`` — or whatever ``BaseTool`` it was — with the same name,
description and args schema). Every call path runs the step: ``invoke``/``ainvoke``
→ ``run``/``arun`` → ``_run``/``_arun``, and an ``ainvoke`` of a sync-only tool runs
the step on the event loop and the function in a worker thread (LangChain would run
the whole ``invoke`` in a thread).

LangGraph propagates tool exceptions: a gate refusal raises ``GateRefused`` out of
the run (and the saga rolls back) unless the ``ToolNode`` was built with
``handle_tool_errors=True``, which turns it into a tool message.

Human in the loop: :class:`InterruptApprover` asks through LangGraph's own
``interrupt()``; the graph pauses, and the human resumes it with
``Command(resume=approve(payload, by=...))``. The approval carries a digest of the
exact call (tool, arguments, tool-call id): if the arguments changed before the
resumed run reaches the tool, the approval does not apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, get_args

from .._runtime import current_saga
from .._types import ActionSemantics
from ..errors import SagaUsageError
from ..gate import ApprovalRequest, Decision
from ..secrets import find_secrets
from ._common import (
    CallId,
    SagaStep,
    approval_digest,
    current_call_id,
    fields_signature,
    request_digest,
    require,
    resolved,
    run_as_saga,
)

require("langgraph", extra="langgraph", adapter="langgraph")
require("langchain_core.tools", extra="langgraph", adapter="langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool, StructuredTool  # noqa: E402
from langgraph.types import interrupt  # noqa: E402

__all__ = ["InterruptApprover", "approve", "deny", "saga_run", "wrap_tool"]

FRAMEWORK: Final = "langgraph"
PAYLOAD_KIND: Final = "agent-saga/approval"


def wrap_tool(
    tool: BaseTool,
    *,
    semantics: ActionSemantics,
    compensate: Any = None,
    **tool_options: Any,
) -> BaseTool:
    """Make every call of a LangChain tool an agent-saga step.

    Args:
        tool: A LangChain tool (``@tool``, ``StructuredTool.from_function``, any
            ``BaseTool`` subclass).
        semantics: How its side effect can be undone.
        compensate: Factory ``(result) -> Compensation`` (COMPENSABLE tools).
        **tool_options: ``@tool``'s other options (``name``, ``resolver``,
            ``no_effect_on``, ``retry``, ``capture``, ``handler``, ...).

    Returns:
        A tool of ``tool``'s class with the same name, description and args schema.

    Raises:
        SagaUsageError: ``tool`` is not a LangChain tool, is already wrapped, or an
            option is invalid.
    """
    if not isinstance(tool, BaseTool):
        raise SagaUsageError(
            f"langgraph.wrap_tool takes a LangChain tool (BaseTool, e.g. from "
            f"langchain_core.tools.tool), got {type(tool).__name__}"
        )
    base = type(tool)
    if getattr(base, "__agent_saga_step__", None) is not None:
        raise SagaUsageError(f"tool {tool.name!r} is already wrapped by agent-saga")
    visible = _visible_fields(tool)
    step = SagaStep(
        framework=FRAMEWORK,
        name=tool.name,
        signature=visible,
        semantics=semantics,
        compensate=compensate,
        options=tool_options,
        refusal=None,  # LangGraph propagates tool errors: so does a refusal
    )
    namespace: dict[str, Any] = {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "__agent_saga_step__": step,
        "__agent_saga_base__": base,
        "__agent_saga_visible__": frozenset(visible.parameters),
        "run": _run_entry,
        "arun": _arun_entry,
        "_run": _run,
        "_arun": _arun,
    }
    if issubclass(base, StructuredTool):
        # StructuredTool.ainvoke runs a sync-only tool's whole `invoke` in a thread;
        # BaseTool.ainvoke goes through `arun`, so the step starts on the event loop.
        namespace["ainvoke"] = BaseTool.ainvoke
    subclass = type(base.__name__, (base,), namespace)
    wrapped = tool.model_copy()
    wrapped.__class__ = subclass
    return wrapped


def _visible_fields(tool: BaseTool) -> inspect.Signature:
    """The arguments the model sees (injected ones excluded), with their defaults."""
    return fields_signature(tool.tool_call_schema)


# --- the overridden call path (methods of the per-tool subclass) ------------------------


def _meta(self: BaseTool) -> tuple[SagaStep, type[BaseTool], frozenset[str]]:
    cls = type(self)
    return cls.__agent_saga_step__, cls.__agent_saga_base__, cls.__agent_saga_visible__  # type: ignore[attr-defined]


def _run_entry(self: BaseTool, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
    _, base, _ = _meta(self)
    with CallId(kwargs.get("tool_call_id")):
        return base.run(self, tool_input, *args, **kwargs)


async def _arun_entry(self: BaseTool, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
    _, base, _ = _meta(self)
    with CallId(kwargs.get("tool_call_id")):
        return await base.arun(self, tool_input, *args, **kwargs)


def _run(
    self: BaseTool,
    *args: Any,
    config: RunnableConfig,
    run_manager: Any = None,
    **kwargs: Any,
) -> Any:
    step, base, visible = _meta(self)
    logged = {k: v for k, v in kwargs.items() if k in visible}

    def forward() -> Any:
        return _call(base._run, self, args, kwargs, config, run_manager)

    with _answer(_ask_human(step, args, logged)), _handler_span(run_manager):
        return step.call_sync(forward, args, logged)


async def _arun(
    self: BaseTool,
    *args: Any,
    config: RunnableConfig,
    run_manager: Any = None,
    **kwargs: Any,
) -> Any:
    step, base, visible = _meta(self)
    logged = {k: v for k, v in kwargs.items() if k in visible}
    native_async = base._arun is not BaseTool._arun and not (
        issubclass(base, StructuredTool) and getattr(self, "coroutine", None) is None
    )

    def forward() -> Any:
        if native_async:
            return _call(base._arun, self, args, kwargs, config, run_manager)
        sync_manager = run_manager.get_sync() if run_manager is not None else None
        return asyncio.to_thread(_call, base._run, self, args, kwargs, config, sync_manager)

    with _answer(_ask_human(step, args, logged)), _handler_span(run_manager):
        return await step.call_async(forward, args, logged)


@contextlib.contextmanager
def _handler_span(run_manager: Any) -> Iterator[None]:
    """The tool run's OpenTelemetry span, current while the step runs.

    A tracing callback handler that keeps a span per run (OpenInference's LangChain
    instrumentor: ``get_span(run_id)``) never attaches it to the context, so without
    this the step's span would land beside the tool's instead of under it.
    """
    span = None
    if run_manager is not None and "opentelemetry.trace" in sys.modules:
        for handler in getattr(run_manager, "handlers", None) or ():
            get_span = getattr(handler, "get_span", None)
            if callable(get_span) and (span := get_span(run_manager.run_id)) is not None:
                break
    if span is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    ):
        yield


def _call(
    method: Any,
    self: BaseTool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    config: RunnableConfig,
    run_manager: Any,
) -> Any:
    """Call the original class's ``_run``/``_arun`` with the plumbing it declares."""
    params = inspect.signature(method).parameters
    extra: dict[str, Any] = {}
    variadic = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "run_manager" in params or variadic:
        extra["run_manager"] = run_manager
    config_param = _config_param(method)
    if config_param is not None:
        extra[config_param] = config
    return method(self, *args, **kwargs, **extra)


def _config_param(method: Any) -> str | None:
    for pname, hint in resolved(method).items():
        if hint is RunnableConfig or RunnableConfig in get_args(hint):
            return pname
    return None


def _saga_step_of(tool: Any) -> SagaStep | None:
    step = getattr(type(tool), "__agent_saga_step__", None)
    return step if isinstance(step, SagaStep) else None


# --- human in the loop through interrupt() ----------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    digest: str
    approved: bool
    by: str
    note: str


_ANSWER: contextvars.ContextVar[_Answer | None] = contextvars.ContextVar(
    "agent_saga_langgraph_answer", default=None
)


class _answer:
    __slots__ = ("_token", "_value")

    def __init__(self, value: _Answer | None) -> None:
        self._value = value
        self._token: contextvars.Token[_Answer | None] | None = None

    def __enter__(self) -> None:
        self._token = _ANSWER.set(self._value)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _ANSWER.reset(self._token)


def _ask_human(step: SagaStep, args: tuple[Any, ...], logged: dict[str, Any]) -> _Answer | None:
    """Pause the graph for a human's decision on an IRREVERSIBLE call, or return it.

    The first time through, ``interrupt()`` raises LangGraph's ``GraphInterrupt`` (the
    graph run ends, paused); when the graph is resumed with ``Command(resume=...)``
    the node runs again and ``interrupt()`` returns the human's answer.
    """
    scope = current_saga()
    if (
        scope is None
        or step.semantics is not ActionSemantics.IRREVERSIBLE
        or not isinstance(scope.approver, InterruptApprover)
    ):
        return None
    kwargs = step.logged_kwargs(args, logged)
    if find_secrets(kwargs):
        # Never put a credential into the graph's state or in front of a human: the
        # gate refuses this call (SecretInKwargs) before anything else happens.
        return None
    payload = {
        "kind": PAYLOAD_KIND,
        "tool": step.name,
        "kwargs": kwargs,
        "tool_call_id": current_call_id(),
        "saga": scope.id,
        "digest": approval_digest(step.name, kwargs, current_call_id()),
        "question": f"approve IRREVERSIBLE call of {step.name!r} with {kwargs!r}?",
    }
    return _parse_answer(interrupt(payload))


def _parse_answer(value: Any) -> _Answer:
    if isinstance(value, Mapping) and isinstance(value.get("digest"), str):
        return _Answer(
            digest=value["digest"],
            approved=value.get("approved") is True,
            by=str(value.get("by") or "human"),
            note=str(value.get("note") or ""),
        )
    # Anything but an answer made by approve()/deny() binds to no call: refuse.
    return _Answer(digest="", approved=False, by="langgraph-interrupt", note="")


class InterruptApprover:
    """Approver that asks a human through LangGraph's ``interrupt()`` (needs a checkpointer).

    Use it as ``saga_run(graph, input, approver=InterruptApprover(), run_options=
    {"config": {"configurable": {"thread_id": ...}}})``. An IRREVERSIBLE wrapped tool
    then pauses the graph with an interrupt whose value is the request (``tool``,
    ``kwargs``, ``tool_call_id``, ``digest``); resume with
    ``Command(resume=approve(value, by="alice"))`` (or :func:`deny`). The gate applies
    the answer only if its digest matches the call about to run.

    A paused graph run has returned: its saga commits what ran before the interrupt,
    and the resumed run is a new saga.

    Args:
        name: How this approver is named in the log when it refuses on its own.
    """

    __slots__ = ("name",)
    #: How its decisions are identified in the approval record (§12.3).
    identity_how: ClassVar[str] = "langgraph-interrupt"

    def __init__(self, name: str = "langgraph-interrupt") -> None:
        self.name = name

    def __call__(self, request: ApprovalRequest) -> Decision:
        """Apply the human's answer to ``request`` if it was given for this exact call."""
        answer = _ANSWER.get()
        if answer is None:
            return Decision.deny(
                self.name,
                f"no human answer for {request.tool!r}: the call did not come through a "
                "LangGraph node of a tool wrapped by agent_saga.adapters.langgraph",
            )
        if answer.digest != request_digest(request):
            return Decision.deny(
                self.name,
                f"the approval was given for other arguments of {request.tool!r} (digest "
                "mismatch); a changed call needs a new approval",
            )
        if not answer.approved:
            return Decision.deny(answer.by, answer.note or "denied by a human")
        return Decision.approve(answer.by, answer.note or "approved through interrupt()")


def approve(payload: Mapping[str, Any], *, by: str, note: str = "") -> dict[str, Any]:
    """The resume value approving the call an interrupt asked about.

    Args:
        payload: The interrupt's value (``result["__interrupt__"][i].value``).
        by: Who approves (recorded in the log).
        note: Why (recorded in the log).

    Returns:
        The value to pass as ``Command(resume=...)``.

    Raises:
        SagaUsageError: ``payload`` is not an agent-saga approval request.
    """
    return _decision(payload, True, by, note)


def deny(payload: Mapping[str, Any], *, by: str, note: str = "") -> dict[str, Any]:
    """The resume value refusing the call an interrupt asked about (see :func:`approve`)."""
    return _decision(payload, False, by, note)


def _decision(payload: Mapping[str, Any], approved: bool, by: str, note: str) -> dict[str, Any]:
    if not isinstance(payload, Mapping) or payload.get("kind") != PAYLOAD_KIND:
        raise SagaUsageError(
            "approve()/deny() take the value of an agent-saga interrupt "
            "(result['__interrupt__'][i].value)"
        )
    if not isinstance(by, str) or not by:
        raise SagaUsageError("say who decides: by='name'")
    return {"digest": payload["digest"], "approved": approved, "by": by, "note": note}


# --- one graph run = one saga -------------------------------------------------------------


async def saga_run(
    target: Any,
    input: Any,
    *,
    run_options: Mapping[str, Any] | None = None,
    abort_on_tool_error: bool = False,
    **saga_options: Any,
) -> Any:
    """Run a compiled LangGraph graph (any Runnable) on ``input`` as one saga.

    ``await target.ainvoke(input, **run_options)`` inside ``async with saga(...)``: if
    the run raises, every wrapped call that completed is compensated newest first and
    the exception propagates unchanged.

    Args:
        target: A compiled graph (``StateGraph(...).compile()``,
            ``create_react_agent(...)``) or any LangChain Runnable.
        input: The graph's input (a state dict, or ``Command(resume=...)``).
        run_options: Keyword arguments for ``ainvoke`` (``config=``, ``context=``).
        abort_on_tool_error: LangGraph propagates tool errors already; this also
            aborts on one a ``ToolNode(handle_tool_errors=True)`` turned into a message.
        **saga_options: ``saga(...)``'s options (``wal_path``, ``approver``, ``name`` ...).

    Returns:
        Whatever ``ainvoke`` returned.
    """
    if not callable(getattr(target, "ainvoke", None)):
        raise SagaUsageError(
            f"langgraph.saga_run runs a compiled graph (anything with .ainvoke), got "
            f"{type(target).__name__}"
        )
    options = dict(run_options or {})
    name = f"langgraph:{getattr(target, 'name', None) or type(target).__name__}"
    return await run_as_saga(
        FRAMEWORK,
        name,
        lambda: target.ainvoke(input, **options),
        saga_options,
        abort_on_tool_error=abort_on_tool_error,
    )
