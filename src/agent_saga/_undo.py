"""Undoing one step: shared, record for record, by in-process rollback and recovery.

The recovery daemon re-enters exactly the transitions the agent uses in-process
(STYLE: DBOS/Temporal): compensate with retries (``compensating`` durable before the
call, ``compensated`` after), resolve a step of unknown outcome through its declared
resolver, or escalate. Deterministic recovery tokens make a second run a no-op.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _crash, _observe
from ._commands import Append, Call, Command, Protocol, Sleep, Submit
from ._registry import accepts_keyword, get_handler
from ._types import Compensation, Receipt, Resolution, RetryPolicy
from .errors import (
    CompensationUnverified,
    ConcurrentWriteDetected,
    HandlerNotRegistered,
    InvalidCompensation,
    OutcomeUnknown,
)
from .secrets import CredentialRef, find_secrets, redact
from .wal import records as R

__all__ = [
    "StepFacts",
    "Target",
    "UndoResult",
    "compensate",
    "compensation_call",
    "duplicate_risk",
    "error_text",
    "escalate",
    "escalation_id",
    "flat",
    "jsonable",
    "now",
    "receipt_fields",
    "receipt_problem",
    "resolve_unknown",
    "revive_refs",
    "run_compensation",
    "undo_compensation",
    "undo_durable_step",
]


def escalation_id(saga_id: str, step: int | None) -> str:
    """Deterministic escalation id, so the agent and every daemon name it alike."""
    digest = hashlib.sha256(f"agent-saga/escalation/{saga_id}/{step}".encode()).hexdigest()
    return f"esc-{digest[:16]}"


def now() -> float:
    """Wall-clock seconds, as every record's ``ts``."""
    return time.time()


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception, redacted and bounded, for the log."""
    # Exception text can carry anything the tool put there, secrets included.
    text = str(redact(str(exc)))
    if len(text) > 500:
        text = text[:500] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _log_default(obj: object) -> Any:
    # Credential references are logged by name; anything else only by its type.
    to_json = getattr(obj, "to_json", None)
    if isinstance(obj, CredentialRef) and to_json is not None:
        return to_json()
    return {"$type": type(obj).__name__}


_SCALARS = frozenset({str, int, float, bool, type(None)})


def flat(mapping: dict[Any, Any]) -> bool:
    """Whether ``mapping`` has only string keys and scalar values (logged as is)."""
    # A plain loop: ``all()`` over a generator costs twice as much on this hot path.
    for k, v in mapping.items():  # noqa: SIM110
        if type(k) is not str or type(v) not in _SCALARS:
            return False
    return True


def jsonable(value: Any) -> Any:
    """Return ``value`` as it will be logged: JSON, credential references by name."""
    if type(value) is dict and flat(value):
        return value  # the common case: flat keyword arguments
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=_log_default))
    return value


def revive_refs(value: Any) -> Any:
    """Turn logged credential references (``{"$credential_ref": n}``) back into objects.

    Handlers receive the same ``CredentialRef`` in-process and in the daemon.
    """
    if isinstance(value, dict):
        if CredentialRef.is_ref(value):
            return CredentialRef.from_json(value)
        return {k: revive_refs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [revive_refs(v) for v in value]
    return value


class Target:
    """The step an undo action is about, as in-process rollback and recovery both see it.

    Recovery builds it from the log (``StepView``); rollback from the live ``Step``.
    """

    __slots__ = (
        "_token",
        "by",
        "idempotency_key",
        "kwargs",
        "may_still_land",
        "preimage",
        "resolver",
        "saga",
        "step",
        "tool",
        "trace",
    )

    def __init__(
        self,
        saga: str,
        step: int,
        tool: str,
        by: str,
        *,
        resolver: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        preimage: Any = None,
        idempotency_key: str = "",
        may_still_land: bool = False,
        trace: str | None = None,
        token: str | None = None,
    ) -> None:
        self.saga = saga
        self.step = step
        self.tool = tool
        self.by = by
        self.resolver = resolver
        self.kwargs = dict(kwargs or {})
        self.preimage = preimage
        self.idempotency_key = idempotency_key
        # The forward call was interrupted while in flight (cancelled, Ctrl-C) in this
        # still-running process: a request it sent may still be executing, so a
        # resolver that finds nothing *yet* proves nothing (docs/concepts.md).
        self.may_still_land = may_still_land
        # The traceparent of the forward step's span (its intent's ``trace``), so a
        # compensation's span can link to it; None when the step was not traced.
        self.trace = trace
        # The step's deterministic recovery token; an undo after commit passes its
        # own (``R.undo_token``), so the two can never be the same compensation.
        self._token = token

    @property
    def token(self) -> str:
        """The step's deterministic recovery token (or the undo token it was given)."""
        return self._token if self._token is not None else R.recovery_token(self.saga, self.step)


def escalate(
    saga_id: str, step: int | None, reason: str, by: str, *, doubt: bool = False
) -> Protocol:
    """Put one item on the durable human queue (deterministic id: no duplicates).

    ``doubt``: the step's outcome is not known (it may have landed, or its undo did
    not verify): the record says so, and the saga is ``in_doubt`` while it is open.
    """
    escalation = escalation_id(saga_id, step)
    record: dict[str, Any] = {
        "type": R.ESCALATED,
        "saga": saga_id,
        "step": step,
        "escalation": escalation,
        "reason": reason,
        "by": by,
        "ts": now(),
    }
    if doubt:
        record["doubt"] = True
    yield Append(record)
    obs = _observe.observer
    if obs is not None:
        obs.escalated(saga_id, step, escalation)


def compensation_call(comp: Compensation, token: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """Resolve the function to run for ``comp`` and its kwargs (token as idempotency key).

    Raises:
        HandlerNotRegistered: ``comp`` has no ``fn`` and its handler is unknown here.
    """
    fn = comp.fn if comp.fn is not None else get_handler(comp.handler or "")
    kwargs = revive_refs(dict(comp.kwargs))
    if "idempotency_key" not in kwargs and accepts_keyword(fn, "idempotency_key"):
        kwargs["idempotency_key"] = token
    return fn, kwargs


def run_compensation(
    t: Target, comp: Compensation, policy: RetryPolicy, *, durable: bool = True
) -> Generator[Command, Any, BaseException | None]:
    """Run ``comp`` with retries; return None on success or the last error.

    Durable: ``compensating`` is made durable *before* the call (the writer checks
    its lease there, so a fenced process never starts a compensation), then
    ``compensated`` after it. Every failed attempt is recorded.
    """
    error, _ = yield from compensate(t, comp, policy, durable=durable)
    return error


def compensate(
    t: Target, comp: Compensation, policy: RetryPolicy, *, durable: bool = True
) -> Generator[Command, Any, tuple[BaseException | None, Receipt | None]]:
    """:func:`run_compensation`, and the :class:`Receipt` the handler returned (or None)."""
    obs = _observe.observer
    if obs is None:
        return (yield from _compensate(t, comp, policy, durable))
    trace = obs.compensation_started(t, comp.handler)
    try:
        error, receipt = yield from _compensate(t, comp, policy, durable)
    except BaseException as exc:
        trace.finish(exc)
        raise
    checked = receipt.outcome if receipt is not None else "unchecked"
    trace.finish(error, None if error is not None else checked)
    return error, receipt


def _compensate(
    t: Target, comp: Compensation, policy: RetryPolicy, durable: bool
) -> Generator[Command, Any, tuple[BaseException | None, Receipt | None]]:
    token = t.token
    try:
        fn, kwargs = compensation_call(comp, token)
    except HandlerNotRegistered as exc:
        return exc, None
    if durable:
        yield Append(
            {
                "type": R.COMPENSATING,
                "saga": t.saga,
                "step": t.step,
                "token": token,
                "by": t.by,
                "ts": now(),
            }
        )
    attempt = 0
    while True:
        attempt += 1
        _crash.crashpoint("rollback.before_compensation")
        try:
            answer = yield Call(fn, (), kwargs)
        except Exception as exc:
            # A concurrent writer is not a transient failure: retrying cannot help.
            delay = (
                None if isinstance(exc, ConcurrentWriteDetected) else policy.delay_after(attempt)
            )
            if durable:
                yield Submit(
                    {
                        "type": R.COMPENSATION_FAILED,
                        "saga": t.saga,
                        "step": t.step,
                        "token": token,
                        "by": t.by,
                        "attempt": attempt,
                        "error": error_text(exc),
                        "final": delay is None,
                        "ts": now(),
                    }
                )
            if delay is None:
                return exc, None
            yield Sleep(delay)
            continue
        _crash.crashpoint("rollback.after_compensation")
        receipt = answer if isinstance(answer, Receipt) else None
        if durable:
            yield Append(
                {
                    "type": R.COMPENSATED,
                    "saga": t.saga,
                    "step": t.step,
                    "token": token,
                    "by": t.by,
                    **receipt_fields(receipt),
                    "ts": now(),
                }
            )
        return None, receipt


def receipt_fields(receipt: Receipt | None) -> dict[str, Any]:
    """What a ``compensated`` (or ``compensation_verified``) record says of ``receipt``.

    ``verified`` (absent: not checked), ``pending``, ``receipt`` (the detail, with
    anything credential-shaped redacted), ``reason`` when it did not match, and
    ``follow`` (``{handler, kwargs}``) for a pending one. ``follow`` kwargs that hold
    a credential are not written: the receipt then cannot be followed, and its
    ``reason`` says so (the step is escalated: fail closed).
    """
    if receipt is None:
        return {}
    out: dict[str, Any] = {"receipt": redact(jsonable(dict(receipt.detail)))}
    if receipt.verified is not None:
        out["verified"] = receipt.verified
    if receipt.reason:
        out["reason"] = str(redact(receipt.reason))[:500]
    if receipt.pending:
        out["pending"] = True
        follow_kwargs = jsonable(dict(receipt.follow_kwargs))
        found = find_secrets(follow_kwargs, path="follow_kwargs")
        if found:
            where = ", ".join(f"{f.path} ({f.kind})" for f in found)
            out["reason"] = (
                f"the pending receipt cannot be followed: {where} looks like a credential "
                "(pass credentials as CredentialRef)"
            )
        else:
            out["follow"] = {"handler": receipt.follow, "kwargs": follow_kwargs}
    return out


def receipt_problem(t: Target, receipt: Receipt | None) -> str | None:
    """The escalation reason when ``receipt`` shows the inverse did not (or cannot) verify."""
    if receipt is None:
        return None
    if receipt.verified is False:
        return (
            f"compensation of {t.tool!r} ran but did not read back as undone: "
            f"{redact(receipt.reason or '')}; the step is in doubt"
        )
    if receipt.pending and "follow" not in receipt_fields(receipt):
        return f"compensation of {t.tool!r} is pending: {receipt_fields(receipt)['reason']}"
    return None


def undo_compensation(
    t: Target, comp: Compensation, policy: RetryPolicy
) -> Generator[Command, Any, tuple[str, BaseException | None]]:
    """Compensate a committed step; escalate it if that fails for good.

    Returns:
        ``("compensated", None)`` or ``("escalated", error)``.
    """
    error, receipt = yield from compensate(t, comp, policy)
    if error is None:
        problem = receipt_problem(t, receipt)
        if problem is None:
            return "compensated", None
        yield from escalate(t.saga, t.step, problem, t.by, doubt=True)
        why = (receipt.reason or "") if receipt is not None else ""
        unverified = CompensationUnverified(problem, reason=why, saga_id=t.saga, step_id=t.step)
        return "escalated", unverified
    if isinstance(error, HandlerNotRegistered):
        reason = f"handler not registered: {comp.handler!r}"
    elif isinstance(error, ConcurrentWriteDetected):
        reason = f"concurrent writer detected while undoing {t.tool!r}: {error_text(error)}"
    else:
        reason = f"compensation of {t.tool!r} failed past its retry budget: {error_text(error)}"
    yield from escalate(t.saga, t.step, reason, t.by)
    return "escalated", error


def resolve_unknown(
    t: Target, policy: RetryPolicy
) -> Generator[Command, Any, tuple[str, BaseException | None]]:
    """Settle a step whose forward call may or may not have landed.

    Only a resolver the tool declared may decide; without one, or when it cannot
    tell, the step is escalated (fail closed).

    Returns:
        ``("no_effect", None)``, ``("compensated", None)``, or ``("escalated", error)``.
    """
    if t.resolver is None:
        yield from escalate(
            t.saga,
            t.step,
            f"outcome unknown: the forward call of {t.tool!r} may or may not have taken "
            "effect and the tool declares no resolver; check it and resolve this by hand",
            t.by,
        )
        return "escalated", None
    try:
        resolver = get_handler(t.resolver)
    except HandlerNotRegistered as exc:
        yield from escalate(
            t.saga, t.step, f"handler not registered: {t.resolver!r}", t.by, doubt=True
        )
        return "escalated", exc
    try:
        verdict = yield Call(
            resolver,
            (),
            {
                "tool": t.tool,
                "kwargs": revive_refs(t.kwargs),
                "preimage": t.preimage,
                "idempotency_key": t.idempotency_key,
            },
        )
    except Exception as exc:
        yield from escalate(
            t.saga, t.step, f"resolver {t.resolver!r} raised {error_text(exc)}", t.by, doubt=True
        )
        return "escalated", exc
    if not isinstance(verdict, Resolution) or verdict.outcome == "undecided":
        why = (
            verdict.reason
            if isinstance(verdict, Resolution)
            else (f"resolver returned {type(verdict).__name__}, not Resolution")
        )
        yield from escalate(t.saga, t.step, f"resolver undecided: {why}", t.by, doubt=True)
        return "escalated", None
    if verdict.outcome == "no_effect" and t.may_still_land:
        yield from escalate(t.saga, t.step, _still_in_flight(t, verdict.reason), t.by, doubt=True)
        return "escalated", None
    if verdict.outcome == "no_effect":
        yield Append(
            {
                "type": R.COMPENSATED,
                "saga": t.saga,
                "step": t.step,
                "token": t.token,
                "by": t.by,
                "outcome": "no_effect",
                "ts": now(),
            }
        )
        return "no_effect", None
    assert verdict.compensation is not None
    return (yield from undo_compensation(t, verdict.compensation, policy))


def _still_in_flight(t: Target, found: str) -> str:
    return (
        f"outcome unknown: the forward call of {t.tool!r} was interrupted while in flight, "
        f"and its resolver {t.resolver!r} found no effect yet ({found}); a call is "
        "'no effect' only once it can no longer land, and this one may still land — "
        "check it and resolve this by hand"
    )


# --- one durable step, whoever undoes it -------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What is known about a durable step when it must be undone.

    In-process rollback builds it from the live step, the recovery daemon from the
    log (``StepView``): both then decide through :func:`undo_durable_step`, so the
    daemon never concludes less than the agent would have.

    Attributes:
        target: The step (saga, step number, tool, who acts, resolver, kwargs ...).
        semantics: ``"compensable"`` or ``"irreversible"``.
        committed: Some attempt completed (a ``committed`` record / a result).
        compensation: The compensation to run, or None when none is valid.
        problem: Why the declared compensation is not valid, when it is not.
        unknown_attempts: Attempts that raised (or never reported back) with an
            unknown outcome: each may have landed.
        idempotent: The tool declared that its service dedupes by idempotency key.
    """

    target: Target
    semantics: str
    committed: bool
    compensation: Compensation | None = None
    problem: str | None = None
    unknown_attempts: Sequence[int] = ()
    idempotent: bool = False


@dataclass(frozen=True, slots=True)
class UndoResult:
    """How undoing one step ended.

    Attributes:
        outcome: ``"compensated"``, ``"no_effect"`` or ``"escalated"``.
        error: What made the saga impossible to restore (None when restored, and for
            an IRREVERSIBLE step, whose approval accepted that it stays).
        reason: The escalation's reason, when escalated.
    """

    outcome: str
    error: BaseException | None = None
    reason: str | None = None


def duplicate_risk(tool: str, attempts: Sequence[int]) -> str:
    """The escalation reason for earlier attempts that may have landed too."""
    return (
        f"{tool!r} attempts {list(attempts)} raised with unknown outcome before a later "
        "attempt succeeded; the effect may have happened more than once (declare "
        "idempotent=True if the service dedupes by idempotency key)"
    )


def undo_durable_step(f: StepFacts, policy: RetryPolicy) -> Generator[Command, Any, UndoResult]:
    """Undo one durable step: compensate, resolve, or escalate — never guess.

    * no attempt completed: only the tool's resolver may decide (``resolve_unknown``);
    * IRREVERSIBLE: escalated for the record (it was approved as such);
    * no valid compensation: escalated;
    * otherwise compensated with the step's recovery token; and if an earlier attempt
      of a non-idempotent tool had an unknown outcome, that attempt may have landed
      as well: escalated, whatever the compensation did.
    """
    t = f.target
    if not f.committed:
        outcome, error = yield from resolve_unknown(t, policy)
        if outcome != "escalated":
            return UndoResult(outcome)
        why = f"step {t.step} ({t.tool}) outcome unknown"
        return UndoResult(outcome, error or _unresolved(t), why)
    if f.semantics == "irreversible":
        reason = (
            f"IRREVERSIBLE step {t.tool!r} completed in a saga that rolled back; it cannot "
            "be undone automatically"
        )
        yield from escalate(t.saga, t.step, reason, t.by)
        return UndoResult("escalated", None, reason)
    if f.compensation is None:
        reason = (
            f"cannot undo {t.tool!r}: {f.problem}"
            if f.problem
            else f"no valid compensation recorded for {t.tool!r}"
        )
        yield from escalate(t.saga, t.step, reason, t.by)
        problem = InvalidCompensation(reason, saga_id=t.saga, step_id=t.step)
        return UndoResult("escalated", problem, reason)
    outcome, error = yield from undo_compensation(t, f.compensation, policy)
    if isinstance(error, CompensationUnverified):
        return UndoResult(outcome, error, str(error))
    if error is not None:
        return UndoResult(outcome, error, f"step {t.step} ({t.tool}) compensation failed")
    if f.unknown_attempts and not f.idempotent:
        reason = duplicate_risk(t.tool, f.unknown_attempts)
        yield from escalate(t.saga, t.step, reason, t.by, doubt=True)
        return UndoResult("escalated", _unresolved(t), reason)
    return UndoResult(outcome)


def _unresolved(t: Target) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"step {t.step} ({t.tool}) has an unknown outcome and was escalated",
        tool=t.tool,
        saga_id=t.saga,
        step_id=t.step,
    )
