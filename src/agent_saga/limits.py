"""Budgets and rate limits: gate policies whose use is reserved in the log.

``Budget("refunds", 150, arg="amount", window=timedelta(days=1))`` sums an argument;
``RateLimit("charges", 10, window=60)`` counts calls. Both are passed like
``MaxArgument``, in ``policies=[...]`` of ``saga(...)`` or ``@tool(...)``. A call they
meter *reserves* its use in its own ``intent`` record, and the log admits the intent
only if every limit still has room — under the append lock on a file, in the append
statement on PostgreSQL — so a budget holds across threads, processes, hosts and
crashes (``docs/governance.md``; the record format is ``docs/log-format.md`` §12.2,
the accounting is :mod:`agent_saga.wal.limits`).

Limits meter the steps that write an ``intent``: COMPENSABLE and IRREVERSIBLE
ones. A REVERSIBLE step is in-process and undone with its saga; it is not metered.
``over_limit="approve"``: a call over the limit is put to the saga's approver with
the usage (``ApprovalRequest.usage``); approved, it runs and its use counts.

Every definition is checked when it is made: a negative or non-numeric limit, a zero
window, an unknown calendar or time zone raise :class:`~agent_saga.errors.SagaUsageError`
at once, never at the first call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable
from datetime import timedelta
from typing import Any, Literal

from .errors import SagaUsageError
from .gate import ApprovalRequest
from .wal.limits import CALENDARS, LimitSpec

__all__ = ["Budget", "LimitPolicy", "RateLimit"]

KeySpec = str | Callable[[ApprovalRequest], Hashable] | None
_OVER_LIMIT = ("refuse", "approve")


class LimitPolicy:
    """What :class:`Budget` and :class:`RateLimit` share: a metered gate policy.

    As a policy (``policy(request)``) it refuses only what it can tell from the call
    alone (a metered argument that is not a number); whether the call fits is decided
    when its reservation is admitted by the log, atomically with the intent.
    """

    __slots__ = ("_key", "over_limit", "spec", "tools")

    spec: LimitSpec
    over_limit: Literal["refuse", "approve"]
    tools: frozenset[str] | None
    _key: KeySpec

    def __init__(
        self,
        spec_args: dict[str, Any],
        *,
        window: float | timedelta | str,
        tz: str,
        key: KeySpec,
        over_limit: str,
        tools: Iterable[str] | None = None,
    ) -> None:
        """Check and compile a definition (see :class:`Budget`, :class:`RateLimit`)."""
        name = spec_args.get("name")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise SagaUsageError(
                "a limit needs a name: a non-empty string of at most 200 characters"
            )
        if over_limit not in _OVER_LIMIT:
            raise SagaUsageError(
                f"limit {name!r}: over_limit must be 'refuse' or 'approve', got {over_limit!r}"
            )
        if key is not None and not (isinstance(key, str) and key) and not callable(key):
            raise SagaUsageError(
                f"limit {name!r}: key must be None (one meter), an argument name, or a "
                "callable of the call returning a hashable key"
            )
        seconds, calendar = _window(name, window)
        key_kind = (
            "global"
            if key is None
            else f"arg:{key}"
            if isinstance(key, str)
            else f"callable:{getattr(key, '__qualname__', type(key).__name__)}"
        )
        spec = LimitSpec(**spec_args, window=seconds, calendar=calendar, tz=tz, key=key_kind)
        try:
            spec.check()
        except ValueError as exc:
            raise SagaUsageError(f"{exc}; fix the limit's definition") from None
        self.spec = spec
        self.over_limit = over_limit  # type: ignore[assignment]
        self._key = key
        self.tools = _tools(name, tools)

    @property
    def name(self) -> str:
        """The policy's name in the log (``limit:<name>``)."""
        return f"limit:{self.spec.name}"

    def applies_to(self, request: ApprovalRequest) -> bool:
        """Whether the call is metered: of one of its ``tools`` (when given), and for a
        budget, a call that has its argument."""
        if self.tools is not None and request.tool not in self.tools:
            return False
        arg = self.spec.arg
        return arg is None or arg in request.kwargs

    def meter_key(self, request: ApprovalRequest) -> str | None:
        """The meter this call counts on: None (one meter), or the key as a string."""
        key = self._key
        if key is None:
            return None
        if isinstance(key, str):
            if key not in request.kwargs:
                raise ValueError(
                    f"the call has no argument {key!r} to key limit {self.spec.name!r} by"
                )
            value: object = request.kwargs[key]
        else:
            value = key(request)
        if isinstance(value, str):
            return value
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)

    def amount(self, request: ApprovalRequest) -> float:
        """What the call reserves: the argument's value (a budget) or 1 (a rate)."""
        arg = self.spec.arg
        if arg is None:
            return 1.0
        value = request.kwargs.get(arg)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(
                f"argument {arg!r} of {request.tool!r} is not a finite number, so limit "
                f"{self.spec.name!r} cannot count it; refused"
            )
        if value < 0:
            raise ValueError(
                f"argument {arg!r} of {request.tool!r} is negative ({value:g}); a budget "
                f"counts uses, a refund is a compensation; refused"
            )
        return float(value)

    def reservation(self, request: ApprovalRequest, now: float) -> dict[str, Any] | None:
        """The ``reserve`` entry this call adds to its intent, or None when not metered.

        Raises:
            ValueError: The metered argument or the key cannot be read; the gate
                refuses the call with this message.
        """
        if not self.applies_to(request):
            return None
        return {
            "limit": self.spec.name,
            "key": self.meter_key(request),
            "amount": self.amount(request),
            "period": self.spec.period(now),
        }

    def __call__(self, request: ApprovalRequest) -> str | None:
        """A gate policy: refuse a call whose metered value or key cannot be read.

        Whether the call fits is not decided here but when its intent is appended:
        the log admits its reservation atomically (``wal/admission.py``).
        """
        try:
            if self.applies_to(request):
                self.amount(request)
                self.meter_key(request)
        except ValueError as exc:
            return str(exc)
        return None

    def check_tool(self, tool: str, parameters: frozenset[str] | None) -> None:
        """Refuse, at declaration, a limit on a tool that does not take its argument.

        Args:
            tool: The tool's name (for the message).
            parameters: The tool's keyword parameters, or None when they cannot be known.
        """
        if parameters is None:
            return
        for label, arg in (("metered argument", self.spec.arg), ("key", _arg_key(self._key))):
            if arg is not None and arg not in parameters:
                raise SagaUsageError(
                    f"limit {self.spec.name!r}: its {label} {arg!r} is not a parameter of "
                    f"tool {tool!r} (it takes {', '.join(sorted(parameters)) or 'nothing'})"
                )

    def __repr__(self) -> str:
        """The definition, as declared."""
        return f"<{type(self).__name__} {self.spec.definition()!r}>"


def _arg_key(key: KeySpec) -> str | None:
    return key if isinstance(key, str) else None


class Budget(LimitPolicy):
    """At most ``limit`` of argument ``arg`` per window, per key.

    Args:
        name: The limit's name in the log, ``agent-saga limits`` and messages.
        limit: The most the calls of one window may add up to (>= 0).
        arg: The metered keyword argument (default ``"amount"``); calls without it
            are not metered.
        window: A sliding window (seconds > 0, or a ``timedelta``), or a calendar
            window: ``"day"`` or ``"month"`` in ``tz``.
        key: None (one meter), an argument name (a meter per value: per customer),
            or a callable of the :class:`~agent_saga.gate.ApprovalRequest` returning a
            hashable key (per tenant, per agent, combinations).
        net: Whether a compensated call gives its amount back (default: the gross
            use stays counted).
        over_limit: ``"refuse"`` (default) or ``"approve"``: ask the saga's approver,
            showing the usage.
        tz: The calendar window's IANA time zone (default ``"UTC"``).
        tools: Meter only calls of these tools (default: every tool; for a budget,
            every tool that has the argument).

    Raises:
        SagaUsageError: The definition is invalid (checked here, not at the first call).
    """

    __slots__ = ()

    def __init__(
        self,
        name: str,
        limit: float,
        *,
        arg: str = "amount",
        window: float | timedelta | str,
        key: KeySpec = None,
        net: bool = False,
        over_limit: str = "refuse",
        tz: str = "UTC",
        tools: Iterable[str] | None = None,
    ) -> None:
        """See the class docstring."""
        if not isinstance(arg, str) or not arg:
            raise SagaUsageError(f"budget {name!r}: arg must name a keyword argument")
        _check_limit(name, limit)
        super().__init__(
            {"name": name, "kind": "budget", "max": float(limit), "net": bool(net), "arg": arg},
            window=window,
            tz=tz,
            key=key,
            over_limit=over_limit,
            tools=tools,
        )


class RateLimit(LimitPolicy):
    """At most ``calls`` metered calls per window, per key.

    Args:
        name: The limit's name.
        calls: The most calls one window may hold (an integer >= 0).
        window: As for :class:`Budget`.
        key: As for :class:`Budget`.
        over_limit: As for :class:`Budget`.
        tz: As for :class:`Budget`.
        tools: Meter only calls of these tools (default: every durable call).

    Raises:
        SagaUsageError: The definition is invalid.
    """

    __slots__ = ()

    def __init__(
        self,
        name: str,
        calls: int,
        *,
        window: float | timedelta | str,
        key: KeySpec = None,
        over_limit: str = "refuse",
        tz: str = "UTC",
        tools: Iterable[str] | None = None,
    ) -> None:
        """See the class docstring."""
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise SagaUsageError(
                f"rate limit {name!r}: calls must be an integer >= 0, got {calls!r}"
            )
        super().__init__(
            {"name": name, "kind": "rate", "max": float(calls), "net": False, "arg": None},
            window=window,
            tz=tz,
            key=key,
            over_limit=over_limit,
            tools=tools,
        )


def _tools(name: str, tools: Iterable[str] | None) -> frozenset[str] | None:
    if tools is None:
        return None
    if isinstance(tools, str):
        raise SagaUsageError(f"limit {name!r}: tools= takes tool names, not one string")
    out = frozenset(tools)
    if not out or not all(isinstance(t, str) and t for t in out):
        raise SagaUsageError(f"limit {name!r}: tools= must name at least one tool")
    return out


def _check_limit(name: str, limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise SagaUsageError(f"budget {name!r}: limit must be a number, got {limit!r}")
    if not math.isfinite(limit) or limit < 0:
        raise SagaUsageError(f"budget {name!r}: limit must be finite and >= 0, got {limit!r}")


def _window(name: str, window: object) -> tuple[float | None, str | None]:
    if isinstance(window, str):
        if window not in CALENDARS:
            raise SagaUsageError(
                f"limit {name!r}: a calendar window is one of {', '.join(CALENDARS)}; "
                f"got {window!r} (or give seconds or a timedelta)"
            )
        return None, window
    if isinstance(window, timedelta):
        seconds = window.total_seconds()
    elif isinstance(window, int | float) and not isinstance(window, bool):
        seconds = float(window)
    else:
        raise SagaUsageError(
            f"limit {name!r}: window must be seconds, a timedelta, 'day' or 'month'; got {window!r}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise SagaUsageError(f"limit {name!r}: the window must be longer than 0 seconds")
    return seconds, None
