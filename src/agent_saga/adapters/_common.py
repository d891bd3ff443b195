"""What the five framework adapters share: one framework tool call = one ``@tool`` step.

A framework adapter finds, in the framework's own tool object, the place where the
user's code is finally called (after the framework parsed and validated the model's
arguments, below the place where it catches exceptions) and calls
:meth:`SagaStep.call_sync` / :meth:`SagaStep.call_async` there with a zero-argument
*forward* closure that does the framework's own call. The step itself is the core's
``@tool`` machinery — gate, durable intent, forward call, compensation from the
result — applied to a shim whose signature is the tool's model-visible arguments, so
the log holds exactly those arguments (never the framework's plumbing: contexts,
callbacks, cancellation tokens).

Why the forward call travels in a context variable and not as an argument: the
engine logs every argument of the function it calls, and the closure is not one
the model gave.

A tool wrapped with ``defer=True`` (IRREVERSIBLE) is gated and recorded when the
model calls it, and the model is told, in :func:`scheduled_message`'s words (one
wording, shared with the MCP proxy), that the action is scheduled and has not
happened; the framework's own call is bound to the deferred step and made once the
run's saga commits (never if it rolls back).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import hashlib
import importlib
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final, TypeVar

from .._deferred import binding_deferred, scheduled_message
from .._observe import CALL_ID
from .._runtime import current_saga
from .._saga_context import saga
from .._tool_decorator import local_tool, tool
from .._types import ActionSemantics, Deferred
from .._undo import jsonable
from ..errors import GateRefused, MissingExtra, NoActiveSaga, SagaUsageError, install_hint
from ..gate import ApprovalRequest

__all__ = [
    "TOOL_OPTIONS",
    "CallId",
    "MissingExtra",
    "RunState",
    "SagaStep",
    "approval_digest",
    "current_call_id",
    "dress",
    "fields_signature",
    "keyword_signature",
    "refusal_message",
    "request_digest",
    "require",
    "resolved",
    "run_as_saga",
    "scheduled_message",
    "step_idempotency_key",
    "without_params",
]

T = TypeVar("T")

#: ``@tool``'s keyword options that ``wrap_tool`` passes through, read from
#: ``tool`` itself so that an option the core gains is an adapter option too.
TOOL_OPTIONS: Final = frozenset(
    p.name for p in inspect.signature(tool).parameters.values() if p.kind is p.KEYWORD_ONLY
) - {"semantics", "compensate"}

_SAGA_OPTIONS: Final = frozenset(
    p.name for p in inspect.signature(saga).parameters.values() if p.kind is p.KEYWORD_ONLY
)

_KEY = "idempotency_key"


def require(module: str, *, extra: str, adapter: str) -> ModuleType:
    """Import a framework module for an adapter, or say which extra provides it.

    Args:
        module: The framework's module (``"langgraph"``).
        extra: The extra that installs it.
        adapter: The adapter asking (for the message).

    Returns:
        The imported module.

    Raises:
        MissingExtra: the framework is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"agent_saga.adapters.{adapter} needs the {extra!r} extra: "
            f"{install_hint(extra)} (could not import {module}: {exc})",
            extra=extra,
            package=module,
        ) from exc


# --- what the step knows about the framework call it runs in ---------------------------

_FORWARD: contextvars.ContextVar[Callable[[], Any] | None] = contextvars.ContextVar(
    "agent_saga_adapter_forward", default=None
)
_CALL_ID = CALL_ID  # the engine's, so the step's trace can name the framework's call
_IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agent_saga_adapter_idempotency_key", default=None
)


def step_idempotency_key() -> str | None:
    """The idempotency key of the wrapped tool call running now, or None outside one.

    A framework tool cannot declare an ``idempotency_key`` parameter without the
    model seeing it, so a wrapped tool's function reads the step's deterministic key
    here instead (pass it to a service that dedupes, e.g. Stripe's Idempotency-Key).
    """
    return _IDEMPOTENCY_KEY.get()


def current_call_id() -> str | None:
    """The framework's id of the tool call being run (the model's tool-call id), if known."""
    return _CALL_ID.get()


class CallId:
    """Context manager: the framework's tool-call id for the duration of one call."""

    __slots__ = ("_token", "_value")

    def __init__(self, value: str | None) -> None:
        self._value = value
        self._token: contextvars.Token[str | None] | None = None

    def __enter__(self) -> None:
        self._token = _CALL_ID.set(self._value)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _CALL_ID.reset(self._token)


def approval_digest(tool_name: str, kwargs: Mapping[str, Any], call_id: str | None) -> str:
    """Digest binding a human's approval to one exact call.

    Over the tool's name, the call's canonical arguments (as the gate logs them) and
    the model's tool-call id. An approval whose digest differs from the call about to
    run does not apply to it.
    """
    canonical = json.dumps(
        {"tool": tool_name, "kwargs": jsonable(dict(kwargs)), "call": call_id},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def request_digest(request: ApprovalRequest) -> str:
    """:func:`approval_digest` of the call an approval request is about."""
    return approval_digest(request.tool, request.kwargs, current_call_id())


# --- signatures ------------------------------------------------------------------------


def keyword_signature(fields: Mapping[str, Any]) -> inspect.Signature:
    """A keyword-only signature: ``fields`` maps names to defaults (``Parameter.empty``)."""
    params = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in fields.items()
    ]
    return inspect.Signature(params)


def fields_signature(model: Any) -> inspect.Signature:
    """A keyword-only signature from a pydantic model's fields (the tool's arguments)."""
    fields = getattr(model, "model_fields", None)
    defaults: dict[str, Any] = {}
    if isinstance(fields, Mapping):
        for name, field in fields.items():
            required = field.is_required()
            defaults[name] = (
                inspect.Parameter.empty
                if required
                else field.get_default(call_default_factory=True)
            )
    return keyword_signature(defaults)


def dress(fn: Any, *, name: str, signature: inspect.Signature | None, doc: str | None) -> None:
    """Give a shim the name, signature and docstring a framework introspects."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    if signature is not None:
        fn.__signature__ = signature


def without_params(signature: inspect.Signature, names: Iterable[str]) -> inspect.Signature:
    """``signature`` without the named parameters (the framework's plumbing)."""
    drop = set(names)
    return signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name not in drop]
    )


def resolved(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations, evaluated in ``fn``'s own module (empty when they cannot be)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable annotations: the framework will say so itself
        return dict(getattr(fn, "__annotations__", {}))


def _with_key(signature: inspect.Signature) -> tuple[inspect.Signature, bool]:
    """Add a keyword-only ``idempotency_key`` unless the model itself supplies one."""
    params = list(signature.parameters.values())
    if _KEY in signature.parameters:
        return signature, False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return signature, True
    key = inspect.Parameter(_KEY, inspect.Parameter.KEYWORD_ONLY, default="")
    return signature.replace(parameters=[*params, key]), True


# --- the step ----------------------------------------------------------------------------


def refusal_message(exc: GateRefused, semantics: ActionSemantics) -> str:
    """What a model is told when the gate refused its call (the call was not made)."""
    tool_name = exc.tool or "?"
    if semantics is ActionSemantics.IRREVERSIBLE and exc.decided_by not in ("gate", "secret-scan"):
        return (
            f"refused: needs human approval (tool {tool_name}) — {exc.reason} "
            f"[decided by {exc.decided_by}]. The call was not made; do not retry it, "
            "tell the user it needs a human's approval."
        )
    return (
        f"refused by the pre-flight gate (tool {tool_name}) — {exc.reason} "
        f"[decided by {exc.decided_by}]. The call was not made; do not retry it unchanged."
    )


def _bind_forward(forward: Callable[[], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Bind the framework's call to a deferred step's shim, for the run after the commit."""

    def bind(shim: Callable[..., Any]) -> Callable[..., Any]:
        async def later_async(*args: Any, **kwargs: Any) -> Any:
            token = _FORWARD.set(forward)
            try:
                return await shim(*args, **kwargs)
            finally:
                _FORWARD.reset(token)

        def later(*args: Any, **kwargs: Any) -> Any:
            token = _FORWARD.set(forward)
            try:
                return shim(*args, **kwargs)
            finally:
                _FORWARD.reset(token)

        return later_async if inspect.iscoroutinefunction(shim) else later

    return bind


class SagaStep:
    """One framework tool's agent-saga step, reachable from sync and async call paths.

    Args:
        framework: The adapter's name (for messages).
        name: The name the log records (the framework tool's name, or ``name=``).
        signature: The tool's model-visible arguments (what the log records).
        semantics: The tool's side-effect semantics.
        compensate: Factory ``(result) -> Compensation``.
        options: ``@tool``'s other keyword options.
        refusal: Turns a gate refusal into what the framework should hand the model
            (a frameworks that reports tool errors to the model gets a message
            instead of an exception, so it does not retry a refused call); None
            lets ``GateRefused`` propagate.

    Raises:
        SagaUsageError: an option ``@tool`` does not have, or an invalid declaration.
    """

    __slots__ = (
        "_async",
        "_strip_key",
        "_sync",
        "defer",
        "framework",
        "name",
        "refusal",
        "semantics",
        "visible_name",
    )

    def __init__(
        self,
        *,
        framework: str,
        name: str,
        signature: inspect.Signature,
        semantics: ActionSemantics,
        compensate: Callable[..., Any] | None,
        options: Mapping[str, Any],
        refusal: Callable[[GateRefused], Any] | None,
    ) -> None:
        unknown = sorted(set(options) - TOOL_OPTIONS)
        if unknown:
            raise SagaUsageError(
                f"wrap_tool got unexpected option(s) {', '.join(unknown)}; it takes "
                f"@tool's options: semantics, compensate, {', '.join(sorted(TOOL_OPTIONS))}"
            )
        self.framework = framework
        self.visible_name = name
        self.name = str(options.get("name") or name)
        self.defer = options.get("defer") is True
        self.semantics = semantics
        self.refusal = refusal
        sig, self._strip_key = _with_key(signature)

        def forward_sync(*args: Any, **kwargs: Any) -> Any:
            token = _IDEMPOTENCY_KEY.set(kwargs.get(_KEY))
            try:
                return self._forward()()
            finally:
                _IDEMPOTENCY_KEY.reset(token)

        async def forward_async(*args: Any, **kwargs: Any) -> Any:
            # The key stays set until the awaitable is done: a coroutine's body (and the
            # context a worker thread copies) only runs once it is awaited.
            token = _IDEMPOTENCY_KEY.set(kwargs.get(_KEY))
            try:
                result = self._forward()()
                if inspect.isawaitable(result):
                    result = await result
                return result
            finally:
                _IDEMPOTENCY_KEY.reset(token)

        doc = f"{framework} tool {self.name!r}, run as an agent-saga step."
        for shim in (forward_sync, forward_async):
            dress(shim, name=self.name, signature=sig, doc=doc)
        declared = {**options, "name": self.name}
        # local_tool: a deferred call needs the framework's own call, which no other
        # process (saga-recoveryd) can make; the two shims may share the name.
        make = local_tool(semantics=semantics, compensate=compensate, **declared)
        self._sync = make(forward_sync)
        self._async = make(forward_async)

    def _forward(self) -> Callable[[], Any]:
        call = _FORWARD.get()
        if call is None:  # pragma: no cover - only SagaStep sets it, right before
            raise SagaUsageError(f"{self.name!r}: forward call missing")
        return call

    def _no_saga(self) -> NoActiveSaga:
        return NoActiveSaga(
            f"{self.framework} tool {self.name!r} was called outside any saga, so it did not "
            f"run: run the agent with agent_saga.adapters.{self.framework}.saga_run(...) or "
            "inside `async with saga(...)`"
        )

    @property
    def spec(self) -> Any:
        """The core's ``ToolSpec`` of this step."""
        return self._sync.__agent_saga_tool__  # type: ignore[attr-defined]

    def logged_kwargs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments as the gate will judge and the log will record them."""
        bound: dict[str, Any] = jsonable(self.spec.bind(args, dict(kwargs)))
        return bound

    def call_sync(
        self, forward: Callable[[], Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """Run one call from a synchronous call path of the framework.

        In an async saga whose event loop runs this very thread (a framework calling a
        sync path from a coroutine), the step runs in a helper thread so that its fsyncs
        and the approver do not need the loop this thread is blocking.

        Args:
            forward: Makes the framework's own call of the user's code.
            args: Positional arguments as the framework passes them.
            kwargs: Keyword arguments as the framework passes them (logged).

        Returns:
            The tool's result, or the framework's form of a refusal.

        Raises:
            NoActiveSaga: no saga is active.
            GateRefused: the gate refused and the framework expects an exception.
        """
        scope = current_saga()
        if scope is None:
            raise self._no_saga()
        token = _FORWARD.set(forward)
        try:
            with self._deferring(forward):
                if scope.is_async and _loop_running():
                    ctx = contextvars.copy_context()
                    with concurrent.futures.ThreadPoolExecutor(1, "agent-saga-step") as pool:
                        return self._settle(
                            lambda: pool.submit(ctx.run, self._sync, *args, **kwargs).result()
                        )
                return self._settle(lambda: self._sync(*args, **kwargs))
        finally:
            _FORWARD.reset(token)

    def _deferring(self, forward: Callable[[], Any]) -> contextlib.AbstractContextManager[None]:
        """A deferred step keeps ``forward`` for its run after the commit."""
        if not self.defer:
            return contextlib.nullcontext()
        return binding_deferred(_bind_forward(forward))

    async def call_async(
        self,
        forward: Callable[[], Awaitable[Any] | Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """Run one call from an asynchronous call path of the framework.

        The step starts on the event loop, in the task the framework runs the call in
        (so it belongs to the saga even when the framework would run a sync function
        in an executor that does not carry context variables).

        Args:
            forward: Makes the framework's own call (returns the result or an awaitable).
            args: Positional arguments as the framework passes them.
            kwargs: Keyword arguments as the framework passes them (logged).

        Returns:
            The tool's result, or the framework's form of a refusal.

        Raises:
            NoActiveSaga: no saga is active.
            GateRefused: the gate refused and the framework expects an exception.
        """
        scope = current_saga()
        if scope is None:
            raise self._no_saga()
        token = _FORWARD.set(forward)
        try:
            with self._deferring(forward):
                step = asyncio.ensure_future(self._settle_async(self._async(*args, **kwargs)))
        finally:
            _FORWARD.reset(token)
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            await _let_land(step, scope.run.options.inflight_grace_seconds)
            raise

    def _told(self, result: Any) -> Any:
        """The result as the framework hands it to the model (a deferral: scheduled)."""
        if isinstance(result, Deferred):
            return scheduled_message(self.visible_name, result.id)
        return result

    def _settle(self, run: Callable[[], Any]) -> Any:
        try:
            return self._told(run())
        except GateRefused as exc:
            if self.refusal is None:
                raise
            return self.refusal(exc)
        except Exception as exc:
            _note_failure(self.name, exc)
            raise

    async def _settle_async(self, step: Awaitable[Any]) -> Any:
        try:
            return self._told(await step)
        except GateRefused as exc:
            if self.refusal is None:
                raise
            return self.refusal(exc)
        except Exception as exc:
            _note_failure(self.name, exc)
            raise


async def _let_land(step: asyncio.Future[Any], grace: float) -> None:
    """The framework cancelled a call in flight (frameworks cancel a turn's other calls
    when one fails): the call may still land, so it is given ``grace`` seconds to end
    by itself — a result then joins the saga and is undone by it — before it is
    cancelled (an interrupted call, which only its resolver finding it can undo)."""
    if not step.done() and grace > 0:
        await asyncio.wait({step}, timeout=grace)
    if not step.done():
        step.cancel()
        await asyncio.wait({step})
    if not step.cancelled():
        step.exception()  # retrieved: the framework gets its cancellation instead


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# --- one framework run = one saga --------------------------------------------------------


@dataclass(slots=True)
class RunState:
    """What ``saga_run`` learns from the wrapped tools while the framework runs.

    Attributes:
        abort_on_tool_error: Whether a failed wrapped call aborts the saga.
        failed_tool: The first wrapped tool whose call raised, if any.
        failure: Its exception.
    """

    abort_on_tool_error: bool
    failed_tool: str | None = None
    failure: Exception | None = None

    @property
    def name(self) -> str:
        """The policy's name in the log."""
        return "abort-on-tool-error"

    def __call__(self, request: ApprovalRequest) -> str | None:
        """Gate policy: once a wrapped call failed, refuse every further step."""
        if self.failure is None:
            return None
        return (
            f"the saga is aborting: tool {self.failed_tool!r} failed "
            f"({type(self.failure).__name__}); no further side effects"
        )


_RUN: contextvars.ContextVar[RunState | None] = contextvars.ContextVar(
    "agent_saga_adapter_run", default=None
)


def _note_failure(tool_name: str, exc: Exception) -> None:
    state = _RUN.get()
    if state is not None and state.failure is None and not isinstance(exc, GateRefused):
        state.failed_tool, state.failure = tool_name, exc


async def run_as_saga(
    framework: str,
    default_name: str,
    start: Callable[[], Awaitable[T]],
    saga_options: Mapping[str, Any],
    *,
    abort_on_tool_error: bool = False,
) -> T:
    """Run ``start()`` (the framework's own run) as one saga and return its result.

    Args:
        framework: The adapter's name (for messages).
        default_name: The saga's name unless ``saga_options`` has one.
        start: Starts the framework's run; awaited inside the saga.
        saga_options: ``saga(...)``'s keyword options.
        abort_on_tool_error: A wrapped call that raised (which the framework may have
            reported to the model and gone on) refuses every later step, and once the
            framework returns, its exception is raised so the saga rolls back.

    Returns:
        The framework's result.

    Raises:
        SagaUsageError: an option ``saga(...)`` does not have.
    """
    unknown = sorted(set(saga_options) - _SAGA_OPTIONS)
    if unknown:
        raise SagaUsageError(
            f"{framework}.saga_run got unexpected option(s) {', '.join(unknown)}; it takes "
            f"saga(...)'s options ({', '.join(sorted(_SAGA_OPTIONS))}), plus run_options= "
            "for the framework's run and abort_on_tool_error="
        )
    if not isinstance(abort_on_tool_error, bool):
        raise SagaUsageError("abort_on_tool_error must be True or False")
    options = dict(saga_options)
    options.setdefault("name", default_name)
    state = RunState(abort_on_tool_error)
    if abort_on_tool_error:
        options["policies"] = (*tuple(options.get("policies", ())), state)
    async with saga(**options):
        token = _RUN.set(state)
        try:
            result = await start()
        finally:
            _RUN.reset(token)
        if abort_on_tool_error and state.failure is not None:
            raise state.failure
        return result
