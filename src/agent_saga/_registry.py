"""The process-wide registry of named compensation handlers and resolvers.

A closure cannot cross a process boundary; a name can. The agent and the recovery
daemon both import the modules that register the same names.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, overload

from .errors import HandlerNotRegistered, SagaUsageError

__all__ = [
    "accepts_keyword",
    "get_handler",
    "is_registered",
    "register_handler",
    "registered_handlers",
    "unregister_handler",
]

F = TypeVar("F", bound=Callable[..., Any])

_handlers: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()
_accepts_cache: weakref.WeakKeyDictionary[Callable[..., Any], dict[str, bool]] = (
    weakref.WeakKeyDictionary()
)


@overload
def register_handler(name: str) -> Callable[[F], F]: ...
@overload
def register_handler(name: str, fn: F) -> F: ...


def register_handler(name: str, fn: Callable[..., Any] | None = None) -> Any:
    """Register ``fn`` as the compensation handler (or resolver) called ``name``.

    Use as ``@register_handler("stripe.refund")`` or ``register_handler(name, fn)``.
    A handler that accepts an ``idempotency_key`` keyword receives the step's
    deterministic recovery token there.

    Args:
        name: Stable, non-empty name; recorded in the log.
        fn: The function (sync or async). Omit to use as a decorator.

    Returns:
        ``fn`` unchanged (or a decorator that registers and returns it).

    Raises:
        SagaUsageError: the name is empty, ``fn`` is not callable, or another
            function is already registered under ``name``.
    """
    if not isinstance(name, str) or not name.strip():
        raise SagaUsageError("register_handler needs a non-empty handler name")

    def _register(f: F) -> F:
        if not callable(f):
            raise SagaUsageError(f"handler {name!r} must be callable")
        with _lock:
            existing = _handlers.get(name)
            if existing is not None and existing is not f and _identity(existing) != _identity(f):
                raise SagaUsageError(
                    f"handler {name!r} is already registered to {_identity(existing)}; "
                    "choose another name or unregister it first"
                )
            _handlers[name] = f
        return f

    if fn is None:
        return _register
    return _register(fn)


def _identity(fn: Callable[..., Any]) -> str:
    # Re-importing a module (e.g. a daemon's --import after the agent's own import)
    # re-creates the function object; same module + qualname is the same handler.
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def unregister_handler(name: str) -> None:
    """Remove ``name`` from the registry (tests and plugins reloading)."""
    with _lock:
        _handlers.pop(name, None)


def get_handler(name: str) -> Callable[..., Any]:
    """Return the handler registered as ``name``.

    Raises:
        HandlerNotRegistered: nobody registered it in this process.
    """
    try:
        return _handlers[name]
    except KeyError:
        raise HandlerNotRegistered(
            f"handler not registered: {name!r} — import the module that registers it "
            "(for saga-recoveryd: --import MODULE)",
            handler=name,
        ) from None


def is_registered(name: str) -> bool:
    """Return whether ``name`` is registered in this process."""
    return name in _handlers


def registered_handlers() -> dict[str, Callable[..., Any]]:
    """Return a copy of the registry."""
    with _lock:
        return dict(_handlers)


def accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    """Return whether ``fn`` can be called with ``keyword=...`` (cached per function)."""
    try:
        per_fn = _accepts_cache.get(fn)
    except TypeError:  # not weak-referenceable: just compute
        per_fn = None
    if per_fn is not None and keyword in per_fn:
        return per_fn[keyword]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        result = False
    else:
        result = keyword in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
    with contextlib.suppress(TypeError):
        _accepts_cache.setdefault(fn, {})[keyword] = result
    return result
