"""Value types shared by the engine, the gate and the recovery daemon."""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SagaUsageError

__all__ = [
    "RECEIPT_DETAIL_LIMIT",
    "ActionSemantics",
    "Compensation",
    "Deferred",
    "Receipt",
    "Resolution",
    "RetryPolicy",
]


class ActionSemantics(enum.Enum):
    """How a tool's side effect can be undone.

    Attributes:
        REVERSIBLE: restored exactly by an in-process snapshot; nothing is logged to disk.
        COMPENSABLE: offset by an inverse action from a named handler; durable and
            crash-recoverable.
        IRREVERSIBLE: no automated undo; the gate demands a human's approval first.
    """

    REVERSIBLE = "reversible"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"


class Compensation:
    """The inverse of one completed step, built by the tool's factory from its result.

    Args:
        fn: Callable run in-process on rollback (sync or async). Optional when
            ``handler`` names a registered handler.
        handler: Stable name under which the recovery daemon finds the same
            function (``register_handler``). Required for durable recovery.
        kwargs: JSON-serializable keyword arguments for ``fn``/the handler; they are
            written to the log, so they must hold no secret (use credential
            references). ``None`` means ``{}``.
        undo_until: Wall-clock seconds after which the service no longer accepts this
            inverse (a card refund window): an undo after commit past it plans the step
            as one that cannot be undone, and escalates it (recorded with ``committed``,
            ``docs/log-format.md`` §12.5). None: no limit of the service's.

    Raises:
        SagaUsageError: neither ``fn`` nor ``handler`` is given, or the types are wrong.
    """

    __slots__ = ("fn", "handler", "kwargs", "undo_until")

    fn: Callable[..., Any] | None
    handler: str | None
    kwargs: Mapping[str, Any]
    undo_until: float | None

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        handler: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        undo_until: float | None = None,
    ) -> None:
        if fn is None and handler is None:
            raise SagaUsageError(
                "Compensation needs fn= (in-process undo) or handler= (a registered "
                "handler name), or both"
            )
        if fn is not None and not callable(fn):
            raise SagaUsageError(f"Compensation fn must be callable, got {type(fn).__name__}")
        if handler is not None and (not isinstance(handler, str) or not handler):
            raise SagaUsageError("Compensation handler must be a non-empty string")
        if kwargs is None:
            kwargs = {}
        elif not isinstance(kwargs, Mapping):
            raise SagaUsageError(
                f"Compensation kwargs must be a mapping, got {type(kwargs).__name__}"
            )
        if undo_until is not None and (
            isinstance(undo_until, bool)
            or not isinstance(undo_until, int | float)
            or undo_until != undo_until  # NaN
        ):
            raise SagaUsageError(
                f"Compensation undo_until must be wall-clock seconds, got {undo_until!r}"
            )
        self.fn = fn
        self.handler = handler
        self.kwargs = kwargs
        self.undo_until = None if undo_until is None else float(undo_until)

    def __repr__(self) -> str:
        fn = getattr(self.fn, "__qualname__", None) if self.fn is not None else None
        return f"Compensation(fn={fn}, handler={self.handler!r}, kwargs={dict(self.kwargs)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Compensation):
            return NotImplemented
        return (self.fn, self.handler, dict(self.kwargs), self.undo_until) == (
            other.fn,
            other.handler,
            dict(other.kwargs),
            other.undo_until,
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Deferred:
    """What a ``@tool(defer=True)`` call returns: the call is scheduled, not made.

    It runs once the saga commits, exactly once, and never if the saga rolls back
    (``docs/undo.md``). ``str()`` of it is a sentence an agent's model can read.

    Attributes:
        saga_id: The saga it belongs to.
        step: Its step number in that saga (its id: ``f"{saga_id}:{step}"``).
        tool: The tool that will run.
    """

    saga_id: str
    step: int
    tool: str

    @property
    def id(self) -> str:
        """The deferred step's id: ``<saga id>:<step>``."""
        return f"{self.saga_id}:{self.step}"

    def __str__(self) -> str:
        return (
            f"scheduled: {self.tool} runs once saga {self.saga_id} commits "
            f"(deferred step {self.id}); it never runs if the saga rolls back"
        )


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a resolver found out about a forward call whose outcome was unknown.

    Build one with the class methods: ``Resolution.no_effect()`` (the call did not
    land; nothing to undo), ``Resolution.landed(Compensation(...))`` (it landed; undo
    it with this), ``Resolution.undecided("why")`` (cannot tell; a human decides).
    """

    outcome: str
    compensation: Compensation | None = None
    reason: str = ""

    @classmethod
    def no_effect(cls, reason: str = "") -> Resolution:
        """The forward call did not take effect."""
        return cls("no_effect", None, reason)

    @classmethod
    def landed(cls, compensation: Compensation, reason: str = "") -> Resolution:
        """The forward call took effect; ``compensation`` undoes it."""
        if not isinstance(compensation, Compensation):
            raise SagaUsageError("Resolution.landed() needs a Compensation")
        return cls("landed", compensation, reason)

    @classmethod
    def undecided(cls, reason: str) -> Resolution:
        """It cannot be told whether the forward call took effect: escalate."""
        return cls("undecided", None, reason)


#: The largest ``Receipt.detail`` accepted, as JSON (it is written to the log).
RECEIPT_DETAIL_LIMIT = 2048


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a compensation proved about its inverse: verified, pending, or not matching.

    A compensation handler may return one; the ``compensated`` record then says
    ``verified`` / ``pending`` and keeps ``detail`` (``docs/log-format.md`` §12.6). A
    handler that returns anything else is *compensated (unverified)*: it ran without
    raising, which is not proof. Build one with the class methods:

    * ``Receipt.confirmed({"refund": "re_1", "status": "succeeded"})`` — the handler
      read the inverse back and it matched;
    * ``Receipt.mismatch("the row holds status='review'", {...})`` — it read it back
      and it did not match: the step is escalated and the saga is *in doubt*;
    * ``Receipt.awaiting("stripe.refund_status", {"refund": "re_1", ...}, {...})`` — the
      service accepted the inverse but it is not final (a refund ``pending``):
      ``saga-recoveryd`` calls the registered ``follow`` handler with ``follow_kwargs``
      on each pass until it returns a final receipt.

    Attributes:
        verified: True matched, False did not, None not checked (or not yet).
        pending: Accepted, not final yet (``verified`` is None).
        detail: Small JSON facts to keep (refund id and status, row key and digest,
            file hash); secret-scanned before it is written; at most 2 KiB.
        reason: Why it did not match (``mismatch``).
        follow: Registered handler that checks a pending inverse again.
        follow_kwargs: Its keyword arguments (logged: credentials as references).
    """

    verified: bool | None = None
    pending: bool = False
    detail: Mapping[str, Any] = field(default_factory=dict)
    reason: str | None = None
    follow: str | None = None
    follow_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verified not in (True, False, None):
            raise SagaUsageError("Receipt.verified must be True, False or None")
        if not isinstance(self.detail, Mapping) or not all(isinstance(k, str) for k in self.detail):
            raise SagaUsageError("Receipt.detail must be a mapping with string keys")
        try:
            size = len(json.dumps(dict(self.detail), default=_ref_json))
        except (TypeError, ValueError) as exc:
            raise SagaUsageError(f"Receipt.detail must be JSON: {exc}") from None
        if size > RECEIPT_DETAIL_LIMIT:
            raise SagaUsageError(
                f"Receipt.detail is {size} bytes as JSON; keep it under "
                f"{RECEIPT_DETAIL_LIMIT} (ids, statuses, digests — not whole objects)"
            )
        if self.pending:
            if self.verified is not None:
                raise SagaUsageError("a pending Receipt is not verified yet: leave verified None")
            if not isinstance(self.follow, str) or not self.follow:
                raise SagaUsageError(
                    "a pending Receipt needs follow=, the registered handler that checks "
                    "it again (saga-recoveryd calls it until it is final)"
                )
        if self.verified is False and not self.reason:
            raise SagaUsageError("a Receipt that did not verify needs reason= (what differs)")
        if not isinstance(self.follow_kwargs, Mapping):
            raise SagaUsageError("Receipt.follow_kwargs must be a mapping")

    @classmethod
    def confirmed(cls, detail: Mapping[str, Any] | None = None) -> Receipt:
        """The inverse was read back and matched."""
        return cls(verified=True, detail=detail or {})

    @classmethod
    def mismatch(cls, reason: str, detail: Mapping[str, Any] | None = None) -> Receipt:
        """The inverse was read back and did not match: ``reason`` says what differs."""
        return cls(verified=False, detail=detail or {}, reason=reason)

    @classmethod
    def awaiting(
        cls,
        follow: str,
        follow_kwargs: Mapping[str, Any] | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Receipt:
        """Accepted, not final: ``follow(**follow_kwargs)`` checks it again later."""
        return cls(
            pending=True, detail=detail or {}, follow=follow, follow_kwargs=follow_kwargs or {}
        )

    @property
    def outcome(self) -> str:
        """``verified``, ``unverified`` (read back, did not match) or ``pending``."""
        if self.pending:
            return "pending"
        return {True: "verified", False: "unverified"}.get(self.verified, "unchecked")  # type: ignore[arg-type]


def _ref_json(obj: object) -> Any:
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    raise TypeError(f"{type(obj).__name__} is not JSON")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Bounded retries with exponential backoff (used for compensations and tools).

    Args:
        attempts: Total attempts, at least 1 (1 = no retry).
        initial_delay: Seconds before the second attempt.
        multiplier: Growth of the delay per attempt.
        max_delay: Upper bound of one delay.
        jitter: Fraction of random spread added to each delay (0 = none).
    """

    attempts: int = 3
    initial_delay: float = 0.05
    multiplier: float = 2.0
    max_delay: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise SagaUsageError("RetryPolicy.attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise SagaUsageError("RetryPolicy delays must be >= 0 and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise SagaUsageError("RetryPolicy.jitter must be between 0 and 1")

    def delay_after(self, attempt: int) -> float | None:
        """Return the pause after failed ``attempt`` (1-based), or None when exhausted."""
        if attempt >= self.attempts:
            return None
        base = min(self.initial_delay * self.multiplier ** (attempt - 1), self.max_delay)
        return base * (1 + self.jitter * random.random())  # noqa: S311 - not cryptographic
