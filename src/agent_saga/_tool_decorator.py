"""``@tool``: a thin shell around the engine.

The decorator checks the declaration once and picks the tool's wrapper once, at
decoration time: sync or async, REVERSIBLE (the in-process fast path,
``_reversible``) or durable (the step protocol of ``_engine``, or the straight-line
path of ``_runtime``). ``saga`` is :mod:`agent_saga._saga_context`'s.
"""

from __future__ import annotations

import functools
import inspect
from asyncio import current_task
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ParamSpec, TypeVar, overload

from . import _engine as E
from ._registry import accepts_keyword
from ._reversible import reversible_begin, reversible_done, reversible_failed, reversible_gate
from ._runtime import (
    Scope,
    _current,
    drive_async,
    drive_sync,
    is_async_context,
    straight_step_async,
)
from ._tools import ToolSpec, plain_defaults, plain_parameters
from ._types import ActionSemantics, RetryPolicy
from .errors import NoActiveSaga, SagaUsageError
from .secrets import find_secrets

__all__ = ["local_tool", "tool"]


P = ParamSpec("P")
R = TypeVar("R")

_REVERSIBLE = ActionSemantics.REVERSIBLE


def _no_saga(spec: ToolSpec) -> NoActiveSaga:
    return NoActiveSaga(
        f"tool {spec.name!r} was called outside any saga, so its effect could not be undone; "
        "run it inside `with saga(...)` / `async with saga(...)` (or call "
        f"{spec.name}.__wrapped__ to bypass agent-saga deliberately)"
    )


def _make_spec(
    fn: Callable[..., Any],
    *,
    semantics: ActionSemantics,
    compensate: Callable[..., Any] | None,
    name: str | None,
    snapshot: Callable[..., Any] | None,
    capture: Callable[..., Any] | None,
    resolver: str | None,
    handler: str | None,
    no_effect_on: Iterable[type[BaseException]],
    retry: RetryPolicy | None,
    retry_on: Iterable[type[BaseException]],
    idempotent: bool,
    trace_args: Iterable[str] = (),
    secret_args: Iterable[str] = (),
    policies: Iterable[Any] = (),
    defer: bool = False,
) -> ToolSpec:
    if not isinstance(semantics, ActionSemantics):
        raise SagaUsageError(f"semantics must be an ActionSemantics member, got {semantics!r}")
    if not isinstance(defer, bool):
        raise SagaUsageError(f"defer= must be True or False, not {defer!r}")
    if defer and semantics is not ActionSemantics.IRREVERSIBLE:
        raise SagaUsageError(
            "defer=True is for IRREVERSIBLE tools (run once the saga commits); a "
            "REVERSIBLE or COMPENSABLE one runs now and is undone if the saga rolls back"
        )
    if semantics is ActionSemantics.IRREVERSIBLE and compensate is not None:
        raise SagaUsageError(
            "an IRREVERSIBLE tool has no compensation by definition; use COMPENSABLE"
        )
    if snapshot is not None and semantics is not _REVERSIBLE:
        raise SagaUsageError(
            "snapshot= is for REVERSIBLE tools; use capture= for durable pre-images"
        )
    if capture is not None and semantics is _REVERSIBLE:
        raise SagaUsageError("capture= records a durable pre-image; REVERSIBLE tools use snapshot=")
    for label, value in (("compensate", compensate), ("snapshot", snapshot), ("capture", capture)):
        if value is not None and not callable(value):
            raise SagaUsageError(f"{label}= must be callable")
    for label, text in (("name", name), ("resolver", resolver), ("handler", handler)):
        if text is not None and (not isinstance(text, str) or not text):
            raise SagaUsageError(f"{label}= must be a non-empty string")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise SagaUsageError("retry= must be a RetryPolicy")
    for label, text in (("name", name), ("resolver", resolver), ("handler", handler)):
        _refuse_credential_in(label, text)
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    traced = _trace_args(trace_args, signature)
    hidden = _secret_args(secret_args, signature, traced)
    tool_name = name or getattr(fn, "__qualname__", None) or repr(fn)
    own = _tool_policies(tool_name, policies, signature, semantics)
    return ToolSpec(
        name=tool_name,
        semantics=semantics,
        compensate=compensate,
        snapshot=snapshot,
        capture=capture,
        resolver=resolver,
        handler=handler,
        no_effect_on=tuple(no_effect_on),
        retry=retry,
        retry_on=tuple(retry_on),
        idempotent=idempotent,
        signature=signature,
        wants_idempotency_key=accepts_keyword(fn, "idempotency_key"),
        plain_defaults=plain_defaults(signature),
        plain_params=plain_parameters(signature),
        trace_args=traced,
        secret_args=hidden,
        policies=own,
        defer=defer,
    )


def _tool_policies(
    tool: str,
    policies: Iterable[Any],
    signature: inspect.Signature | None,
    semantics: ActionSemantics,
) -> tuple[Any, ...]:
    """Check ``policies=``: callables; a limit's metered argument and key are parameters."""
    from .limits import LimitPolicy

    if isinstance(policies, str) or not isinstance(policies, Iterable):
        raise SagaUsageError("policies= takes an iterable of gate policies")
    out = tuple(policies)
    parameters: frozenset[str] | None = None
    if signature is not None and not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    ):
        parameters = frozenset(signature.parameters) - {"idempotency_key"}
    for policy in out:
        if not callable(policy):
            raise SagaUsageError(f"policy {policy!r} of tool {tool!r} is not callable")
        if isinstance(policy, LimitPolicy):
            if semantics is ActionSemantics.REVERSIBLE:
                raise SagaUsageError(
                    f"limit {policy.spec.name!r} on REVERSIBLE tool {tool!r}: such a call "
                    "logs nothing, so nothing can meter it; limit a durable tool instead"
                )
            if policy.tools is not None and tool not in policy.tools:
                raise SagaUsageError(
                    f"limit {policy.spec.name!r} is declared on tool {tool!r} but its tools= "
                    f"leaves that tool out; drop tools= (a tool's own limit meters it)"
                )
            policy.check_tool(tool, parameters)
    return out


def _secret_args(
    names: Iterable[str], signature: inspect.Signature | None, traced: tuple[str, ...]
) -> frozenset[str]:
    """Check ``secret_args=``: named parameters of the tool, never also traced."""
    if isinstance(names, str):
        raise SagaUsageError("secret_args= takes an iterable of argument names, not one string")
    out = frozenset(names)
    for name in out:
        if not isinstance(name, str) or not name or name == "idempotency_key":
            raise SagaUsageError(
                "secret_args= names must be the tool's own arguments (non-empty strings)"
            )
        if signature is not None and name not in signature.parameters:
            raise SagaUsageError(
                f"secret_args= names {name!r}, which is not an argument of the tool "
                f"(it takes {', '.join(signature.parameters) or 'nothing'})"
            )
        if name in traced:
            raise SagaUsageError(f"{name!r} is in both secret_args= and trace_args=; pick one")
    return out


def _trace_args(names: Iterable[str], signature: inspect.Signature | None) -> tuple[str, ...]:
    """Check ``trace_args=``: parameter names of the tool, never its idempotency key."""
    if isinstance(names, str):
        raise SagaUsageError("trace_args= takes an iterable of argument names, not one string")
    out = tuple(names)
    for name in out:
        if not isinstance(name, str) or not name:
            raise SagaUsageError("trace_args= names must be non-empty strings")
        if name == "idempotency_key":
            raise SagaUsageError("an idempotency key is never shown in traces (trace_args=)")
        if signature is not None and name not in signature.parameters:
            has_var_kw = any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
            )
            if not has_var_kw:
                raise SagaUsageError(f"trace_args= names {name!r}, which is not an argument")
    return out


def _refuse_credential_in(label: str, text: str | None) -> None:
    # A tool's name, resolver and handler are written to every record of every call:
    # a credential in one would be in the log in clear, so refuse it at decoration.
    if text is None:
        return
    found = find_secrets(text, path=label)
    if found:
        raise SagaUsageError(
            f"{label}= looks like it holds a {found[0].kind}; it is written to the log with "
            f"every call. Name the tool, not the credential, and pass the credential as a "
            f"CredentialRef argument"
        )


class _AsyncTool:
    """What ``@tool`` returns for an ``async def``: calling it makes the step's coroutine.

    It is a plain callable rather than an ``async def`` so that the coroutine is
    made by agent-saga: inside a saga it is remembered, and a call that was never
    awaited by the time the saga ends is an error naming the tool, not a step that
    silently never ran. It keeps the function's name, docstring, signature and
    code flags, so ``inspect.iscoroutinefunction`` and frameworks still see an
    async function.
    """

    def __init__(self, body: Callable[..., Any], fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self._body = body
        # inspect.iscoroutinefunction reads these from function-like objects.
        self.__code__ = fn.__code__
        self.__defaults__ = getattr(fn, "__defaults__", None)
        self.__kwdefaults__ = getattr(fn, "__kwdefaults__", None)
        if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12+
            inspect.markcoroutinefunction(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        coro = self._body(*args, **kwargs)
        scope = _current.get()
        if scope is not None:
            _remember(scope, coro, self.__agent_saga_tool__)  # type: ignore[attr-defined]
        return coro

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<agent-saga tool {self.__agent_saga_tool__.name!r}>"  # type: ignore[attr-defined]


_PRUNE_AT = 1024


def _remember(scope: Scope, coro: Any, spec: ToolSpec) -> Any:
    """Remember a tool coroutine made inside a saga, to tell at its end if it ever ran.

    Coroutines that already started are dropped now and then, so a long saga of
    many awaited calls keeps only the few that are still pending.
    """
    calls = scope.run.calls
    calls.append((coro, spec.name))
    n = len(calls)
    if n >= _PRUNE_AT and n & (n - 1) == 0:  # at powers of two: amortised O(1) per call
        calls[:] = [c for c in calls if inspect.getcoroutinestate(c[0]) == inspect.CORO_CREATED]
    return coro


def _wrap(fn: Callable[..., Any], spec: ToolSpec) -> Callable[..., Any]:
    reversible = spec.semantics is _REVERSIBLE
    current = _current.get

    if inspect.iscoroutinefunction(fn):
        if reversible:

            async def async_reversible(*args: Any, **kwargs: Any) -> Any:
                scope = current()
                if scope is None:
                    raise _no_saga(spec)
                if scope.policies or spec.policies:
                    refusal = reversible_gate(scope, spec, args, kwargs)
                    if refusal is not None:
                        await drive_async(E.refusal_protocol(scope, spec, refusal), scope.run)
                step = reversible_begin(scope, spec, args, kwargs)
                try:
                    result = await fn(*args, **kwargs)
                except BaseException:
                    reversible_failed(step)
                    raise
                return reversible_done(step, result)

            wrapper: Callable[..., Any] = async_reversible
        else:

            async def async_durable(*args: Any, **kwargs: Any) -> Any:
                scope = current()
                if scope is None:
                    raise _no_saga(spec)
                if E.goes_straight(scope, spec):
                    return await _tracked(scope, straight_step_async, scope, spec, fn, args, kwargs)
                protocol = E.step_protocol(scope, spec, fn, args, kwargs)
                return await _tracked(scope, drive_async, protocol, scope.run)

            wrapper = async_durable
        tool_object = _AsyncTool(wrapper, fn)
        tool_object.__agent_saga_tool__ = spec  # type: ignore[attr-defined]
        return tool_object
    elif reversible:

        def sync_reversible(*args: Any, **kwargs: Any) -> Any:
            scope = current()
            if scope is None:
                raise _no_saga(spec)
            if scope.is_async and is_async_context(scope):
                return _remember(
                    scope, _sync_reversible_in_async(scope, spec, fn, args, kwargs), spec
                )
            if scope.policies or spec.policies:
                refusal = reversible_gate(scope, spec, args, kwargs)
                if refusal is not None:
                    drive_sync(E.refusal_protocol(scope, spec, refusal), scope.run)
            step = reversible_begin(scope, spec, args, kwargs)
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                reversible_failed(step)
                raise
            return reversible_done(step, result)

        wrapper = sync_reversible
    else:

        def sync_durable(*args: Any, **kwargs: Any) -> Any:
            scope = current()
            if scope is None:
                raise _no_saga(spec)
            protocol = E.step_protocol(scope, spec, fn, args, kwargs)
            if scope.is_async and is_async_context(scope):
                return _remember(scope, _tracked(scope, drive_async, protocol, scope.run), spec)
            return drive_sync(protocol, scope.run)

        wrapper = sync_durable

    functools.update_wrapper(wrapper, fn)
    wrapper.__agent_saga_tool__ = spec  # type: ignore[attr-defined]
    return wrapper


async def _tracked(scope: Scope, run_step: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Await ``run_step(*args)``, registered as in flight so a rollback can wait for it."""
    inflight = scope.run.inflight
    task = current_task()
    inflight.append(task)
    try:
        return await run_step(*args)
    finally:
        inflight.remove(task)


async def _sync_reversible_in_async(
    scope: Scope, spec: ToolSpec, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    if scope.policies or spec.policies:
        refusal = reversible_gate(scope, spec, args, kwargs)
        if refusal is not None:
            await drive_async(E.refusal_protocol(scope, spec, refusal), scope.run)
    step = reversible_begin(scope, spec, args, kwargs)
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        reversible_failed(step)
        raise
    return reversible_done(step, result)


@overload
def tool(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def tool(
    *,
    semantics: ActionSemantics = ...,
    compensate: Callable[..., Any] | None = ...,
    name: str | None = ...,
    snapshot: Callable[..., Any] | None = ...,
    capture: Callable[..., Any] | None = ...,
    resolver: str | None = ...,
    handler: str | None = ...,
    no_effect_on: Iterable[type[BaseException]] = ...,
    retry: RetryPolicy | None = ...,
    retry_on: Iterable[type[BaseException]] = ...,
    idempotent: bool = ...,
    trace_args: Iterable[str] = ...,
    secret_args: Iterable[str] = ...,
    policies: Iterable[Any] = ...,
    defer: bool = ...,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    semantics: ActionSemantics = ActionSemantics.IRREVERSIBLE,
    compensate: Callable[..., Any] | None = None,
    name: str | None = None,
    snapshot: Callable[..., Any] | None = None,
    capture: Callable[..., Any] | None = None,
    resolver: str | None = None,
    handler: str | None = None,
    no_effect_on: Iterable[type[BaseException]] = (),
    retry: RetryPolicy | None = None,
    retry_on: Iterable[type[BaseException]] = (Exception,),
    idempotent: bool = False,
    trace_args: Iterable[str] = (),
    secret_args: Iterable[str] = (),
    policies: Iterable[Any] = (),
    defer: bool = False,
) -> Any:
    """Declare a function (sync or async) as an agent tool with a typed side effect.

    Inside an async saga the tool is awaited (a sync tool then returns an
    awaitable); inside a sync saga it is called directly. Outside any saga it
    raises :class:`~agent_saga.errors.NoActiveSaga`. Name, docstring and signature
    are kept; the original function is ``tool.__wrapped__``.

    Args:
        fn: The function, when used as bare ``@tool``. A bare ``@tool`` declares the
            side effect IRREVERSIBLE: an unclassified effect needs approval.
        semantics: REVERSIBLE, COMPENSABLE or IRREVERSIBLE.
        compensate: Factory ``(result) -> Compensation`` evaluated right after the
            call (``(result, preimage)`` when ``capture`` is given). Required for
            COMPENSABLE tools (the gate refuses them otherwise).
        name: The name recorded in the log (default: the function's qualified name).
        snapshot: REVERSIBLE only: ``snapshot(*args, **kwargs) -> restore()``, taken
            before the call, restores the previous state on rollback.
        capture: Durable pre-image ``capture(**kwargs) -> JSON``, logged with the
            intent before the call (for connectors that restore a previous state).
        resolver: Name of a registered resolver deciding whether a call of unknown
            outcome landed. Without one, such calls are escalated.
        handler: The compensation handler's name, when static: the gate refuses the
            step if no such handler is registered.
        no_effect_on: Exception types proving the call did not take effect. Any
            other exception leaves the outcome UNKNOWN (it may have landed).
        retry: Retry policy for the forward call; every attempt is logged and all
            attempts share one idempotency key.
        retry_on: Which exceptions are retried (default: any ``Exception``).
        idempotent: The service dedupes by idempotency key, so an attempt of unknown
            outcome followed by a successful one happened once.
        trace_args: Arguments whose values traces may show (``gen_ai.tool.call.arguments``
            when ``agent_saga.observability`` is instrumented); a value the secret
            scanner flags is shown as ``[redacted]`` all the same. Default: none.
        secret_args: Arguments the tool legitimately needs in clear (a user's new
            password): the function receives the value; the log, approval requests,
            refusals, the UI and traces hold its keyed digest instead, so the secret
            scanner does not refuse it. Recovery cannot replay such a step: it is
            resolved or escalated. Default: none.
        policies: Gate policies of this tool alone, e.g. ``[Budget("refunds", 500,
            window=86400)]`` or ``[MaxArgument("amount", 100)]``: judged with the
            saga's ``policies=`` at every call, all or nothing. A limit whose metered
            argument or key is not a parameter of the tool is refused here.
        defer: IRREVERSIBLE only. The call is gated (policies, the approver) and
            recorded when made, returns a :class:`~agent_saga.Deferred` placeholder,
            and runs once the saga commits — exactly once, by this process or, if it
            dies, by ``saga-recoveryd`` (import the tool's module there) — and never
            if the saga rolls back (``docs/undo.md``).

    Returns:
        The wrapped tool (or a decorator producing it).

    Raises:
        SagaUsageError: the declaration is inconsistent.
    """

    options: dict[str, Any] = {
        "semantics": semantics,
        "compensate": compensate,
        "name": name,
        "snapshot": snapshot,
        "capture": capture,
        "resolver": resolver,
        "handler": handler,
        "no_effect_on": no_effect_on,
        "retry": retry,
        "retry_on": retry_on,
        "idempotent": idempotent,
        "trace_args": trace_args,
        "secret_args": secret_args,
        "policies": policies,
        "defer": defer,
    }
    if fn is not None:
        return _declare(fn, options, register=True)
    return functools.partial(_declare, options=options, register=True)


def _declare(f: Callable[..., Any], options: dict[str, Any], *, register: bool) -> Any:
    """Check ``f`` and its declaration, and wrap it (``register``: deferred, for the daemon)."""
    if not callable(f):
        raise SagaUsageError("@tool decorates a function")
    if inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f):
        raise SagaUsageError("@tool cannot wrap a generator function")
    spec = _make_spec(f, **options)
    if spec.defer and register:
        from ._deferred import register_deferred

        register_deferred(spec, f)
    return _wrap(f, spec)


def local_tool(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``tool(**options)`` for a wrapper only this process can call.

    The framework adapters and the MCP proxy wrap a call that cannot be rebuilt in
    another process (a framework's own tool call, a request to the MCP server this
    proxy runs). Such a tool declared ``defer=True`` is not registered for
    ``saga-recoveryd``: if this process dies after the commit before running the
    step, the daemon finds no tool of that name and escalates the step rather than
    guess. Two such wrappers may share a name.
    """
    unknown = sorted(set(options) - set(_TOOL_DEFAULTS))
    if unknown:
        raise SagaUsageError(f"unexpected tool option(s): {', '.join(unknown)}")
    declared = {**_TOOL_DEFAULTS, **options}
    return functools.partial(_declare, options=declared, register=False)


#: ``tool``'s keyword options and their defaults (what :func:`local_tool` takes).
_TOOL_DEFAULTS: dict[str, Any] = {
    p.name: p.default
    for p in inspect.signature(tool).parameters.values()
    if p.kind is p.KEYWORD_ONLY
}
