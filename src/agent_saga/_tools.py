"""``ToolSpec``: everything the engine needs to know about one ``@tool``."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._secret_args import digest_secret_args
from ._types import ActionSemantics, RetryPolicy

__all__ = ["ToolSpec", "plain_defaults", "plain_parameters"]

_CANCELLATION = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)


@dataclass(frozen=True, slots=True, eq=False)
class ToolSpec:
    """The declaration of a tool: its name, semantics and undo machinery.

    Attributes:
        name: Name recorded in the log (defaults to the function's qualified name).
        semantics: How its side effect can be undone.
        compensate: Factory ``(result) -> Compensation`` (``(result, preimage)``
            when ``capture`` is declared).
        snapshot: REVERSIBLE only: called with the call's arguments before the call,
            returns a zero-argument callable that restores the previous state.
        capture: Durable pre-image: called with the call's arguments by name before
            the INTENT record; its JSON-able result is logged with the intent.
        resolver: Name of a registered resolver that can tell whether a forward call
            of unknown outcome took effect.
        handler: The compensation handler name, when known statically (the gate
            refuses the step if it is not registered).
        no_effect_on: Exception types that prove the forward call had no effect.
        retry: Retry policy for the forward call (every attempt is recorded).
        retry_on: Exception types worth retrying.
        idempotent: The service dedupes attempts by the step's idempotency key.
        signature: The wrapped function's signature (to log arguments by name).
        wants_idempotency_key: The function accepts an ``idempotency_key`` keyword;
            the engine passes the step's deterministic key there.
        plain_defaults: Default values by name when the signature has no variadic
            parameters (lets keyword calls be logged without ``Signature.bind``).
        plain_params: ``(parameter names in order, how many may be given
            positionally)`` when every parameter is positional-or-keyword or
            keyword-only (lets positional calls be logged without ``Signature.bind``).
        secret_args: Arguments the function needs in clear and nothing records
            (``@tool(secret_args=...)``): logged as their keyed digests.
        trace_args: Arguments whose values the tool lets traces show (``@tool(trace_args=
            ...)``); every other argument's value stays out of every span.
        policies: Gate policies of this tool alone (``@tool(policies=...)``), judged
            with the saga's own, all or nothing (a budget or rate limit among them).
        defer: IRREVERSIBLE only: gated and recorded when called, run once the saga
            commits (``@tool(defer=True)``, ``_deferred.py``).
    """

    name: str
    semantics: ActionSemantics
    compensate: Callable[..., Any] | None = None
    snapshot: Callable[..., Any] | None = None
    capture: Callable[..., Any] | None = None
    resolver: str | None = None
    handler: str | None = None
    no_effect_on: tuple[type[BaseException], ...] = ()
    retry: RetryPolicy | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    idempotent: bool = False
    signature: inspect.Signature | None = None
    wants_idempotency_key: bool = False
    plain_defaults: dict[str, Any] | None = None
    plain_params: tuple[tuple[str, ...], int] | None = None
    trace_args: tuple[str, ...] = ()
    secret_args: frozenset[str] = frozenset()
    policies: tuple[Any, ...] = ()
    defer: bool = False

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Return the call's arguments by parameter name, defaults applied.

        Policies must judge what the call will really use, so defaults count; the
        idempotency key the engine injects is not an argument of the agent's. A
        secret argument (``secret_args``) is its keyed digest: this is what is
        logged, scanned, judged and shown; the function itself gets the value.
        """
        bound = self._bind(args, kwargs)
        if self.secret_args:
            return digest_secret_args(bound, self.secret_args)
        return bound

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.signature is None:
            return {"args": list(args), **kwargs} if args else dict(kwargs)
        if not args and self.plain_defaults is not None:
            # Fast path (keyword calls, no *args/**kwargs in the signature).
            fast = {**self.plain_defaults, **kwargs}
            if self.wants_idempotency_key and "idempotency_key" not in kwargs:
                fast.pop("idempotency_key", None)
            return fast
        if self.plain_params is not None and self.plain_defaults is not None:
            bound_fast = self._bind_positional(args, kwargs, *self.plain_params)
            if bound_fast is not None:
                return bound_fast
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError:
            return {"args": list(args), **kwargs}
        bound.apply_defaults()
        if self.wants_idempotency_key and "idempotency_key" not in kwargs:
            bound.arguments.pop("idempotency_key", None)
        out: dict[str, Any] = {}
        for pname, value in bound.arguments.items():
            kind = self.signature.parameters[pname].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                out.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                out[pname] = list(value)
            else:
                out[pname] = value
        return out

    def _bind_positional(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], npos: int
    ) -> dict[str, Any] | None:
        """``bind_partial`` + ``apply_defaults`` for plain signatures; None: use bind.

        Gives the same mapping, in the same (parameter) order, as the general path; a
        call that path would reject (too many positionals, a name given twice, an
        unknown keyword) returns None so that it decides.
        """
        if len(args) > npos:
            return None
        defaults = self.plain_defaults or {}
        out: dict[str, Any] = {}
        used = 0
        nargs = len(args)
        for i, pname in enumerate(names):
            if i < nargs:
                if pname in kwargs:
                    return None
                out[pname] = args[i]
            elif pname in kwargs:
                out[pname] = kwargs[pname]
                used += 1
            elif pname in defaults:
                out[pname] = defaults[pname]
        if used != len(kwargs):
            return None
        if self.wants_idempotency_key and "idempotency_key" not in kwargs:
            out.pop("idempotency_key", None)
        return out

    def is_no_effect(self, exc: BaseException) -> bool:
        """Whether ``exc`` proves the forward call did not take effect.

        Cancellation and interrupts never do: the call may have landed.
        """
        return (
            bool(self.no_effect_on)
            and isinstance(exc, self.no_effect_on)
            and not isinstance(exc, _CANCELLATION)
        )

    def retry_delay(self, attempt: int, exc: BaseException) -> float | None:
        """The pause before retrying after failed ``attempt``, or None to give up."""
        if self.retry is None or isinstance(exc, _CANCELLATION) or not isinstance(exc, Exception):
            return None
        if not isinstance(exc, self.retry_on):
            return None
        return self.retry.delay_after(attempt)


def plain_defaults(signature: inspect.Signature | None) -> dict[str, Any] | None:
    """Defaults by parameter name, or None if the signature has variadic parameters."""
    if signature is None:
        return None
    out: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return None
        if param.default is not inspect.Parameter.empty:
            out[name] = param.default
    return out


def plain_parameters(signature: inspect.Signature | None) -> tuple[tuple[str, ...], int] | None:
    """``(names, positional count)`` when every parameter is plain, else None.

    Plain: positional-or-keyword (all before any keyword-only) or keyword-only; a
    positional-only or variadic parameter leaves the call to ``Signature.bind``.
    """
    if signature is None:
        return None
    names: list[str] = []
    npos = 0
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            npos += 1
        elif param.kind is not inspect.Parameter.KEYWORD_ONLY:
            return None
        names.append(name)
    return tuple(names), npos
