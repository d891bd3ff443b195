"""The saga state machine: steps, the gate and the durable step protocol, without I/O.

The protocols are generators that *yield commands* (``_commands``: ``Append`` a
record durably, ``Submit`` one without waiting, ``Call`` user code, ``Approve``,
``Sleep``) and receive their results. ``_runtime`` drives them with a short sync
loop or a short async loop — the only code that differs by colour. Everything that
decides *what* happens (gate verdicts, record contents, LIFO order, retry and
escalation) lives in the engine's modules, once:

* here: :class:`Step` and the protocol of one COMPENSABLE or IRREVERSIBLE step;
* ``_step_gate``: the gate it passes first (automatic checks, the approver,
  limits; a refusal is recorded durably);
* ``_reversible``: the REVERSIBLE fast path. It does no I/O at all, so it is not a
  generator but plain functions both drivers share;
* ``_rollback``: the rollback and settle protocols that end a saga. Undoing one
  step is ``_undo``'s, shared with the recovery daemon.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from . import _crash, _observe
from ._commands import (
    Append,
    AppendFenced,
    Call,
    Forward,
    Protocol,
    Sleep,
    Submit,
)
from ._metering import admitted, metering
from ._step_gate import (
    approval_request,
    ask_approver,
    gate_record,
    over_limit,
    policies_of,
    precheck,
    refusal,
    refuse,
)
from ._types import ActionSemantics, Compensation
from ._undo import error_text, escalation_id, flat, jsonable, now
from .errors import InvalidCompensation, LeaseLost, SecretInKwargs
from .gate import Decision
from .secrets import CredentialRef, assert_no_secrets
from .wal import records as R
from .wal.halts import halt_blocking

if TYPE_CHECKING:
    from ._runtime import Run, Scope
    from ._tools import ToolSpec

__all__ = [
    "Step",
    "StepState",
    "commit_record",
    "fenced_escalation",
    "forward_failed",
    "forward_kwargs",
    "goes_straight",
    "intent_record",
    "new_durable_step",
    "not_sent_record",
    "observed",
    "refusal_protocol",
    "step_protocol",
]

COMPENSABLE: Final = ActionSemantics.COMPENSABLE
IRREVERSIBLE: Final = ActionSemantics.IRREVERSIBLE


# --- steps ------------------------------------------------------------------------


class StepState(enum.Enum):
    """Where a step stands."""

    RUNNING = "running"
    COMMITTED = "committed"
    NO_EFFECT = "no_effect"
    UNKNOWN = "unknown"
    COMPENSATED = "compensated"
    ESCALATED = "escalated"


class Step:
    """One tool call inside a saga, as the engine tracks it.

    Rarely-set fields are class-level defaults: a REVERSIBLE step, created on the
    fast path, sets only four attributes.
    """

    state: StepState
    kwargs: dict[str, Any] = {}  # noqa: RUF012 - replaced, never mutated, per instance
    compensation: Compensation | None = None
    restore: Callable[[], Any] | None = None
    preimage: Any = None
    problem: str | None = None
    forward_error: BaseException | None = None
    durable = False
    attempts = 0
    unknown_attempts: list[int] = []  # noqa: RUF012 - replaced before any append
    idempotency_key = ""
    interrupted = False  # a forward call was cancelled / interrupted while in flight
    obs: _observe.StepTrace | None = None  # set only while an observer is installed

    def __init__(self, step_id: int, spec: ToolSpec, scope: Scope) -> None:
        self.id = step_id
        self.spec = spec
        self.scope = scope
        self.state = StepState.RUNNING

    def __repr__(self) -> str:
        return f"<Step {self.id} {self.spec.name} {self.state.value}>"


# --- the gate (a refusal is recorded durably, whatever the semantics) --------------


def refusal_protocol(scope: Scope, spec: ToolSpec, decision: Decision) -> Protocol:
    """Record a refusal durably, then raise ``GateRefused``; nothing else happens."""
    run = scope.run
    step = Step(run.next_step_id(), spec, scope)
    obs = _observe.observer
    if obs is None:
        return (yield from refuse(run, step, decision))
    step.obs = obs.step_started(step, (), step.kwargs)
    return (yield from observed(step, refuse(run, step, decision)))


def observed(step: Step, protocol: Protocol) -> Protocol:
    """Run ``protocol`` for an observed step, then tell the observer how it ended."""
    trace = step.obs
    assert trace is not None
    try:
        result = yield from protocol
    except BaseException as exc:
        trace.finish(exc)
        raise
    trace.finish(None)
    return result


# --- the durable step protocol ---------------------------------------------------------


def step_protocol(
    scope: Scope, spec: ToolSpec, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Protocol:
    """Run one COMPENSABLE or IRREVERSIBLE step durably (docs/log-format.md).

    gate → INTENT (fsync) → call → factory → COMMITTED (fsync). A call that raised
    is recorded with its outcome (``no_effect`` if the tool declared the exception
    type harmless, else ``unknown``); unknown attempts join the unwind list.
    ``_runtime.straight_step_async`` drives the same pieces (:func:`new_durable_step`,
    :func:`intent_record`, :func:`forward_failed`, :func:`commit_record`) without
    a generator for the common case (:func:`goes_straight`).
    """
    if spec.defer:
        from ._deferred import defer_protocol

        return (yield from defer_protocol(scope, spec, fn, args, kwargs))
    step = new_durable_step(scope, spec, jsonable(spec.bind(args, kwargs)))
    if step.obs is None:
        return (yield from _durable_step(scope, step, fn, args, kwargs))
    return (yield from observed(step, _durable_step(scope, step, fn, args, kwargs)))


def _durable_step(
    scope: Scope, step: Step, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Protocol:
    run, spec = scope.run, step.spec

    # The gate. Refusals and approvers' decisions are recorded as ``gate`` records;
    # a step that passed the automatic checks needs none: its intent says so.
    decision = precheck(run, scope, spec, step)
    if decision is None and spec.semantics is IRREVERSIBLE:
        decision = yield from ask_approver(run, scope, spec, step)
    if decision is not None and not decision.approved:
        yield from run.begin_records()
        yield Append(gate_record(run, step, decision))
        raise refusal(run, step, decision)
    run.side_effects += 1
    yield from run.begin_records()
    approved_by = "gate"  # the automatic checks passed; the intent records that
    approval = None
    if decision is not None:
        approved_by, approval = decision.decided_by, decision.approval
        yield Submit(gate_record(run, step, decision))

    call_kwargs = forward_kwargs(spec, step, kwargs)
    if spec.capture is not None:
        # The pre-image is logged with the intent: it passes the same secret scan as
        # the kwargs, and a hit refuses the step before the forward call (it cannot
        # be redacted: the undo needs it whole). docs/secrets.md has the per-field rule.
        try:
            step.preimage = jsonable((yield Call(spec.capture, (), step.kwargs)))
            assert_no_secrets(step.preimage, path="preimage")
        except SecretInKwargs as exc:
            run.side_effects -= 1
            scanned = Decision.deny("secret-scan", str(exc))
            yield Append(gate_record(run, step, scanned))
            raise refusal(run, step, scanned) from None

    metered = metering(policies_of(scope, spec), lambda: approval_request(run, spec, step))
    if isinstance(metered, Decision):
        run.side_effects -= 1
        yield Append(gate_record(run, step, metered))
        raise refusal(run, step, metered)

    while True:
        step.attempts += 1
        attempt = step.attempts
        _crash.crashpoint("step.before_intent")
        intent = intent_record(run, step, attempt, approved_by, approval)
        try:
            if metered:
                over = yield from admitted(intent, metered)
                if over is not None:
                    yield from over_limit(run, scope, spec, step, intent, metered, over)
            else:
                yield Append(intent)
        except (asyncio.CancelledError, KeyboardInterrupt):
            yield Submit(not_sent_record(run, step, attempt))
            raise
        _crash.crashpoint("step.after_intent")
        try:
            result = yield Forward(fn, args, call_kwargs)
        except BaseException as exc:
            record, delay = forward_failed(run, step, exc, attempt)
            yield Submit(record)
            if delay is None:
                raise
            yield Sleep(delay)
            continue
        _crash.crashpoint("step.after_call")
        break

    committed, problem = commit_record(run, step, result, attempt)
    try:
        yield Append(committed)
    except LeaseLost:
        yield AppendFenced(fenced_escalation(run, step, committed))
        raise
    _crash.crashpoint("step.after_commit")
    if problem is not None:
        raise problem
    return result


# --- the pieces of a durable step (shared with the straight-line driver) ------------


def goes_straight(scope: Scope, spec: ToolSpec) -> bool:
    """Whether this step can take the straight-line path (``_runtime``), not the generator.

    The common COMPENSABLE step: no approval (not IRREVERSIBLE), no policies, no
    pre-image capture, no retries, no tool-level handler or resolver to check, a
    compensation factory. Everything else is the same protocol either way; these
    are the branches the straight path leaves to :func:`step_protocol`.
    """
    return (
        spec.semantics is COMPENSABLE
        and spec.compensate is not None
        and spec.capture is None
        and spec.retry is None
        and spec.handler is None
        and spec.resolver is None
        and not scope.policies
        and not spec.policies
        and not spec.defer
        and halt_blocking(scope.run.log(), tool=spec.name, saga_name=scope.run.name) is None
    )


def new_durable_step(scope: Scope, spec: ToolSpec, kwargs: dict[str, Any]) -> Step:
    """A durable step with its number and idempotency key; ``kwargs`` already bound."""
    run = scope.run
    step = Step(run.next_step_id(), spec, scope)
    step.kwargs = kwargs
    step.durable = True
    step.unknown_attempts = []
    step.idempotency_key = R.idempotency_key(run.id, step.id)
    obs = _observe.observer
    if obs is not None:
        step.obs = obs.step_started(step, (), kwargs)
    return step


def forward_kwargs(spec: ToolSpec, step: Step, kwargs: Any) -> Any:
    """The forward call's kwargs: the caller's, plus the step's idempotency key if wanted."""
    if spec.wants_idempotency_key and "idempotency_key" not in kwargs:
        return {**kwargs, "idempotency_key": step.idempotency_key}
    return kwargs


def intent_record(
    run: Run,
    step: Step,
    attempt: int,
    approved_by: str,
    approval: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``intent`` record of one attempt, written durably before the forward call.

    ``approval``: the durable approval the attempt runs under (``{request, digest}``
    or ``{standing, digest}``, ``docs/log-format.md`` §12.3), recorded as
    ``intent.approval``.
    """
    spec = step.spec
    intent: dict[str, Any] = {
        "type": R.INTENT,
        "saga": run.id,
        "step": step.id,
        "attempt": attempt,
        "tool": spec.name,
        "semantics": spec.semantics.value,
        "kwargs": step.kwargs,
        "idempotency_key": step.idempotency_key,
        "approved_by": approved_by,
        "idempotent": spec.idempotent,
        "ts": now(),
    }
    if approval is not None:
        intent["approval"] = dict(approval)
    if spec.resolver is not None:
        intent["resolver"] = spec.resolver
    if spec.handler is not None:
        intent["handler"] = spec.handler
    if step.preimage is not None:
        intent["preimage"] = step.preimage
    if step.obs is not None:
        trace = step.obs.attempt(attempt)
        if trace is not None:
            intent["trace"] = trace  # docs/log-format.md §12.1
    return intent


def forward_failed(
    run: Run, step: Step, exc: BaseException, attempt: int
) -> tuple[dict[str, Any], float | None]:
    """Settle a forward call that raised: its record, and the pause before a retry.

    An ``unknown`` attempt joins the unwind list here, before its record is even
    queued, so a failure to queue it cannot hide the effect from the rollback.
    The delay is None when the step gives up (the caller re-raises ``exc``).
    """
    spec = step.spec
    outcome = "no_effect" if spec.is_no_effect(exc) else "unknown"
    step.forward_error = exc
    if step.obs is not None:
        step.obs.forward_failed(exc, outcome)
    _crash.crashpoint("step.after_call_failed")
    record = {
        "type": R.FORWARD_FAILED,
        "saga": run.id,
        "step": step.id,
        "attempt": attempt,
        "outcome": outcome,
        "error": error_text(exc),
        "ts": now(),
    }
    if outcome == "unknown":
        if not isinstance(exc, Exception):
            # Cancelled (or Ctrl-C) while in flight: the request it sent may still be
            # executing, so no resolver may call it "no effect" in this process.
            step.interrupted = True
            record["interrupted"] = True
        step.unknown_attempts.append(attempt)
        if step.state is StepState.RUNNING:
            step.state = StepState.UNKNOWN
            run.done.append(step)
    delay = spec.retry_delay(attempt, exc)
    if delay is None and step.state is StepState.RUNNING:
        step.state = StepState.NO_EFFECT
    return record, delay


def not_sent_record(run: Run, step: Step, attempt: int) -> dict[str, Any]:
    """The ``forward_failed`` record of an attempt cancelled while its intent was written.

    The intent may have reached the disk, but the forward call was never made: no
    effect (and the log shows no dangling intent in a saga that ended).
    """
    if step.state is StepState.RUNNING:
        step.state = StepState.NO_EFFECT
    return {
        "type": R.FORWARD_FAILED,
        "saga": run.id,
        "step": step.id,
        "attempt": attempt,
        "outcome": "no_effect",
        "error": "cancelled before the forward call was made",
        "ts": now(),
    }


def commit_record(
    run: Run, step: Step, result: Any, attempt: int
) -> tuple[dict[str, Any], InvalidCompensation | None]:
    """Derive the compensation from ``result``; return the ``committed`` record.

    The step joins the unwind list *before* the record is written, so a failed or
    cancelled write still leaves it to be undone. A factory that raised or made
    something unusable gives the problem to raise once the record is durable.
    """
    spec = step.spec
    problem: InvalidCompensation | None = None
    comp: Compensation | None = None
    if spec.compensate is not None:
        try:
            made = (
                spec.compensate(result, step.preimage) if spec.capture else spec.compensate(result)
            )
        except Exception as exc:
            problem = InvalidCompensation(
                f"compensation factory of {spec.name!r} raised {type(exc).__name__}; the "
                "forward call happened and is escalated for a human to undo",
                saga_id=run.id,
                step_id=step.id,
            )
            problem.__cause__ = exc
        else:
            problem = _check_compensation(run, step, made)
            if problem is None:
                comp = made
    step.compensation = comp
    comp_kwargs: dict[str, Any] = {}
    if comp is not None:
        kw = comp.kwargs
        comp_kwargs = kw if type(kw) is dict and flat(kw) else jsonable(dict(kw))
    committed = {
        "type": R.COMMITTED,
        "saga": run.id,
        "step": step.id,
        "attempt": attempt,
        "handler": comp.handler if comp is not None else None,
        "kwargs": comp_kwargs,
        "token": R.recovery_token(run.id, step.id),
        "ts": now(),
    }
    if comp is not None and comp.undo_until is not None:
        committed["undo_until"] = comp.undo_until  # the service's own limit (§12.5)
    if problem is not None:
        committed["invalid"] = str(problem)
        step.problem = str(problem)
    if step.state is StepState.UNKNOWN:
        run.done.remove(step)
    step.state = StepState.COMMITTED
    run.done.append(step)
    return committed, problem


def fenced_escalation(run: Run, step: Step, committed: dict[str, Any]) -> dict[str, Any]:
    """The escalation a fenced writer still writes when its commit record was refused.

    Fenced after the call returned: the effect happened, but the recovery daemon
    that took the saga over may have settled this step as "not done". Nobody else
    knows; it goes on the human queue, then the step raises ``LeaseLost``.
    """
    comp = step.compensation
    return {
        "type": R.ESCALATED,
        "saga": run.id,
        "step": step.id,
        "escalation": escalation_id(run.id, step.id),
        "reason": f"the forward call of {step.spec.name!r} completed after this process "
        "lost its lease; recovery may have treated it as not done — check and undo "
        f"it by hand (compensation: {comp.handler if comp else None!r} "
        f"{committed['kwargs']!r})",
        "by": run.owner_label(),
        "ts": now(),
    }


def _ref_only(obj: object) -> Any:
    if isinstance(obj, CredentialRef):
        return obj.to_json()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _check_compensation(run: Run, step: Step, made: object) -> InvalidCompensation | None:
    name = step.spec.name
    if not isinstance(made, Compensation):
        return InvalidCompensation(
            f"compensation factory of {name!r} returned {type(made).__name__}, not "
            "Compensation; the forward call happened and is escalated",
            saga_id=run.id,
            step_id=step.id,
        )
    kwargs = made.kwargs if type(made.kwargs) is dict else dict(made.kwargs)
    try:
        if jsonable(kwargs) is not kwargs:
            json.dumps(kwargs, default=_ref_only)
    except (TypeError, ValueError) as exc:
        err = InvalidCompensation(
            f"compensation kwargs of {name!r} are not JSON-serializable ({exc}); they "
            "must be, because recovery reads them from the log",
            saga_id=run.id,
            step_id=step.id,
        )
        return err
    try:
        assert_no_secrets(kwargs, path="compensation.kwargs")
    except SecretInKwargs as exc:
        return InvalidCompensation(
            f"compensation of {name!r}: {exc}", saga_id=run.id, step_id=step.id
        )
    return None
