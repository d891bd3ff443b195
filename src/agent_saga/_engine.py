"""The saga state machine: steps, scopes and the step/rollback protocols, without I/O.

The protocols are generators that *yield commands* (``_commands``: ``Append`` a
record durably, ``Submit`` one without waiting, ``Call`` user code, ``Approve``,
``Sleep``) and receive their results. Undoing one step is ``_undo``'s, shared with
the recovery daemon. ``_runtime`` drives them with a short sync loop or a short
async loop — the only code that differs by colour. Everything that
decides *what* happens (gate verdicts, record contents, LIFO order, retry and
escalation) lives here, once.

The REVERSIBLE fast path is not a generator: it does no I/O at all, so it is a
plain function both drivers share.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Final

from . import _crash
from ._commands import (
    Append,
    AppendFenced,
    Approve,
    Call,
    Command,
    Forward,
    Protocol,
    Sleep,
    Submit,
)
from ._registry import is_registered
from ._types import ActionSemantics, Compensation, RetryPolicy
from ._undo import (
    StepFacts,
    Target,
    duplicate_risk,
    error_text,
    escalate,
    escalation_id,
    flat,
    jsonable,
    now,
    resolve_unknown,
    run_compensation,
    undo_durable_step,
)
from .errors import (
    GateRefused,
    InvalidCompensation,
    LeaseLost,
    OutcomeUnknown,
    SecretInKwargs,
)
from .gate import ApprovalRequest, Decision, as_decision, run_policies
from .secrets import CredentialRef, assert_no_secrets, redact
from .wal import records as R

if TYPE_CHECKING:
    from ._runtime import Run, Scope
    from ._tools import ToolSpec

__all__ = [
    "Step",
    "StepState",
    "commit_outcome",
    "commit_record",
    "fenced_escalation",
    "forward_failed",
    "forward_kwargs",
    "goes_straight",
    "intent_record",
    "new_durable_step",
    "not_sent_record",
    "nothing_to_settle",
    "refusal_protocol",
    "reversible_begin",
    "reversible_done",
    "reversible_failed",
    "reversible_gate",
    "rollback_protocol",
    "settle_protocol",
    "step_protocol",
]

REVERSIBLE: Final = ActionSemantics.REVERSIBLE
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

    def __init__(self, step_id: int, spec: ToolSpec, scope: Scope) -> None:
        self.id = step_id
        self.spec = spec
        self.scope = scope
        self.state = StepState.RUNNING

    def __repr__(self) -> str:
        return f"<Step {self.id} {self.spec.name} {self.state.value}>"


# --- the REVERSIBLE fast path (no I/O) ------------------------------------------------


def reversible_gate(scope: Scope, spec: ToolSpec, args: Any, kwargs: Any) -> Decision | None:
    """Run the scope's policies for a REVERSIBLE call; return the refusal, if any.

    Only called when the scope has policies: REVERSIBLE calls log nothing, so the
    other gate checks (secrets, compensation, approval) do not apply to them.
    """
    run = scope.run
    request = ApprovalRequest(
        run.id,
        run.name,
        spec.name,
        REVERSIBLE,
        spec.bind(args, kwargs),
        run.peek_step_id(),
        run.side_effects,
    )
    return run_policies(scope.policies, request)


def refusal_protocol(scope: Scope, spec: ToolSpec, decision: Decision) -> Protocol:
    """Record a refusal durably, then raise ``GateRefused``; nothing else happens."""
    run = scope.run
    step = Step(run.next_step_id(), spec, scope)
    yield from run.begin_records()
    yield Append(_gate_record(run, step, decision))
    raise _refusal(run, step, decision)


def _refusal(run: Run, step: Step, decision: Decision) -> GateRefused:
    cls = SecretInKwargs if decision.decided_by == "secret-scan" else GateRefused
    return cls(
        f"gate refused {step.spec.name!r}: {decision.reason}",
        tool=step.spec.name,
        reason=decision.reason,
        decided_by=decision.decided_by,
        saga_id=run.id,
        step_id=step.id,
    )


def reversible_begin(scope: Scope, spec: ToolSpec, args: Any, kwargs: Any) -> Step:
    """Take the in-process snapshot of a REVERSIBLE step, before its call."""
    step = Step(scope.run.next_step_id(), spec, scope)
    if spec.snapshot is not None:
        restore = spec.snapshot(*args, **kwargs)
        if restore is not None and not callable(restore):
            raise InvalidCompensation(
                f"snapshot of {spec.name!r} must return a zero-argument restore callable",
                saga_id=scope.run.id,
                step_id=step.id,
            )
        step.restore = restore
    return step


def reversible_failed(step: Step) -> None:
    """A REVERSIBLE call raised: if a snapshot exists, restoring it is still exact."""
    if step.restore is not None:
        step.state = StepState.UNKNOWN
        if step.scope.run.closed:
            _restore_late(step)
        else:
            step.scope.run.done.append(step)


def reversible_done(step: Step, result: Any) -> Any:
    """Record a finished REVERSIBLE call and build its compensation.

    A call that finishes after its saga already unwound (a sibling task still
    running when the saga failed) is restored at once: nobody will unwind it later.
    """
    factory = step.spec.compensate
    if factory is not None:
        try:
            comp = factory(result)
        except Exception as exc:
            problem = f"compensation factory of {step.spec.name!r} raised {type(exc).__name__}"
            _keep_invalid(step, problem)
            raise InvalidCompensation(problem, saga_id=step.scope.run.id, step_id=step.id) from exc
        if type(comp) is not Compensation and not isinstance(comp, Compensation):
            problem = (
                f"compensation factory of {step.spec.name!r} returned "
                f"{type(comp).__name__}, not Compensation"
            )
            _keep_invalid(step, problem)
            raise InvalidCompensation(problem, saga_id=step.scope.run.id, step_id=step.id)
        step.compensation = comp
    step.state = StepState.COMMITTED
    run = step.scope.run
    if run.closed:
        _restore_late(step)
        return result
    run.done.append(step)
    return result


def _restore_late(step: Step) -> None:
    undo = step.restore
    if undo is None and step.compensation is not None:
        undo = functools.partial(step.compensation.fn or (lambda: None), **step.compensation.kwargs)
    if undo is not None:
        undo()
    step.state = StepState.COMPENSATED


def _keep_invalid(step: Step, problem: str) -> None:
    # The effect happened but cannot be undone as declared: rollback escalates it.
    step.problem = problem
    step.restore = None
    step.state = StepState.COMMITTED
    step.scope.run.done.append(step)


# --- the durable step protocol ---------------------------------------------------------


def _request(run: Run, spec: ToolSpec, step: Step) -> ApprovalRequest:
    return ApprovalRequest(
        run.id, run.name, spec.name, spec.semantics, step.kwargs, step.id, run.side_effects
    )


def _precheck(run: Run, scope: Scope, spec: ToolSpec, step: Step) -> Decision | None:
    """The gate's automatic checks; return the refusal, or None when all pass."""
    if spec.semantics is COMPENSABLE and spec.compensate is None:
        return Decision.deny(
            "gate",
            f"COMPENSABLE tool {spec.name!r} declares no compensation; give it "
            "compensate=lambda result: Compensation(...)",
        )
    for declared in (spec.handler, spec.resolver):
        if declared is not None and not is_registered(declared):
            return Decision.deny(
                "gate",
                f"handler not registered: {declared!r} (declared by {spec.name!r}); import "
                "the module that registers it",
            )
    try:
        assert_no_secrets(step.kwargs, path="kwargs")
    except SecretInKwargs as exc:
        return Decision.deny("secret-scan", str(exc))
    if scope.policies:
        return run_policies(scope.policies, _request(run, spec, step))
    return None


def _approval(
    run: Run, scope: Scope, spec: ToolSpec, step: Step
) -> Generator[Command, Any, Decision]:
    """Ask the saga's approver about an IRREVERSIBLE step (fail closed on errors)."""
    try:
        decision = yield Approve(scope.approver, _request(run, spec, step))
    except Exception as exc:  # a broken approver must not open the gate
        return Decision.deny("approver", f"approver raised {type(exc).__name__}; refused")
    return as_decision(decision, source=scope.approver)


def _gate_record(run: Run, step: Step, decision: Decision) -> dict[str, Any]:
    return {
        "type": R.GATE,
        "saga": run.id,
        "step": step.id,
        "tool": step.spec.name,
        "semantics": step.spec.semantics.value,
        "decision": "approved" if decision.approved else "refused",
        "decided_by": decision.decided_by,
        "reason": redact(decision.reason),  # a policy may quote the value it refused
        "ts": now(),
    }


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
    run = scope.run
    step = new_durable_step(scope, spec, jsonable(spec.bind(args, kwargs)))

    # The gate. Refusals and approvers' decisions are recorded as ``gate`` records;
    # a step that passed the automatic checks needs none: its intent says so.
    decision = _precheck(run, scope, spec, step)
    if decision is None and spec.semantics is IRREVERSIBLE:
        decision = yield from _approval(run, scope, spec, step)
    if decision is not None and not decision.approved:
        yield from run.begin_records()
        yield Append(_gate_record(run, step, decision))
        raise _refusal(run, step, decision)
    run.side_effects += 1
    yield from run.begin_records()
    approved_by = "gate"  # the automatic checks passed; the intent records that
    if decision is not None:
        approved_by = decision.decided_by
        yield Submit(_gate_record(run, step, decision))

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
            refusal = Decision.deny("secret-scan", str(exc))
            yield Append(_gate_record(run, step, refusal))
            raise _refusal(run, step, refusal) from None

    while True:
        step.attempts += 1
        attempt = step.attempts
        _crash.crashpoint("step.before_intent")
        try:
            yield Append(intent_record(run, step, attempt, approved_by))
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
    )


def new_durable_step(scope: Scope, spec: ToolSpec, kwargs: dict[str, Any]) -> Step:
    """A durable step with its number and idempotency key; ``kwargs`` already bound."""
    run = scope.run
    step = Step(run.next_step_id(), spec, scope)
    step.kwargs = kwargs
    step.durable = True
    step.unknown_attempts = []
    step.idempotency_key = R.idempotency_key(run.id, step.id)
    return step


def forward_kwargs(spec: ToolSpec, step: Step, kwargs: Any) -> Any:
    """The forward call's kwargs: the caller's, plus the step's idempotency key if wanted."""
    if spec.wants_idempotency_key and "idempotency_key" not in kwargs:
        return {**kwargs, "idempotency_key": step.idempotency_key}
    return kwargs


def intent_record(run: Run, step: Step, attempt: int, approved_by: str) -> dict[str, Any]:
    """The ``intent`` record of one attempt, written durably before the forward call."""
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
    if spec.resolver is not None:
        intent["resolver"] = spec.resolver
    if spec.handler is not None:
        intent["handler"] = spec.handler
    if step.preimage is not None:
        intent["preimage"] = step.preimage
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


# --- in-process rollback and settling ----------------------------------------------------


def _target(run: Run, step: Step) -> Target:
    return Target(
        run.id,
        step.id,
        step.spec.name,
        run.owner_label(),
        resolver=step.spec.resolver,
        kwargs=step.kwargs,
        preimage=step.preimage,
        idempotency_key=step.idempotency_key,
        may_still_land=step.interrupted,
    )


def _escalate(run: Run, step: Step | None, reason: str) -> Protocol:
    yield from run.begin_records()
    yield from escalate(run.id, step.id if step is not None else None, reason, run.owner_label())
    if step is not None:
        step.state = StepState.ESCALATED
    run.escalations.append(reason)


_STATE_OF = {
    "compensated": StepState.COMPENSATED,
    "no_effect": StepState.NO_EFFECT,
    "escalated": StepState.ESCALATED,
}


def _settle(run: Run, step: Step, outcome: str, reason_if_escalated: str | None = None) -> None:
    step.state = _STATE_OF[outcome]
    if outcome == "escalated":
        run.escalations.append(reason_if_escalated or f"step {step.id} escalated")


def _undo(
    run: Run, step: Step, policy: RetryPolicy
) -> Generator[Command, Any, BaseException | None]:
    """Undo one step; return the error when the saga could not be restored."""
    if not step.durable:  # REVERSIBLE: in-process only
        if step.problem is not None and step.compensation is None:
            yield from _escalate(run, step, f"cannot undo {step.spec.name!r}: {step.problem}")
            return InvalidCompensation(step.problem, saga_id=run.id, step_id=step.id)
        comp = Compensation(fn=step.restore) if step.restore is not None else step.compensation
        if comp is None:
            return None  # a REVERSIBLE tool without snapshot or compensation: nothing to undo
        t = Target(run.id, step.id, step.spec.name, "in-process")
        error = yield from run_compensation(t, comp, policy, durable=False)
        if error is None:
            step.state = StepState.COMPENSATED
            return None
        yield from _escalate(
            run,
            step,
            f"restore of REVERSIBLE step {step.spec.name!r} failed: {error_text(error)}",
        )
        return error
    facts = _facts(run, step)
    result = yield from undo_durable_step(facts, policy)
    _settle(run, step, result.outcome, result.reason)
    if isinstance(result.error, OutcomeUnknown) and step.forward_error is not None:
        return _outcome_unknown(run, step, step.forward_error, facts.committed)
    return result.error


def _outcome_unknown(
    run: Run, step: Step, forward: BaseException, committed: bool
) -> OutcomeUnknown:
    name, kind = step.spec.name, type(forward).__name__
    what = "an earlier attempt raised" if committed else "it raised"
    return OutcomeUnknown(
        f"step {step.id} ({name}): {what} {error_text(forward)}, so it may have taken "
        "effect; failing closed, it was escalated to a human instead of assumed undone. "
        f"If {kind} proves that nothing happened, declare "
        f"@tool(..., no_effect_on=({kind},)); if the service can tell, give the tool a "
        "resolver=",
        tool=name,
        error=error_text(forward),
        saga_id=run.id,
        step_id=step.id,
    )


def _facts(run: Run, step: Step) -> StepFacts:
    return StepFacts(
        _target(run, step),
        step.spec.semantics.value,
        committed=step.state is not StepState.UNKNOWN,
        compensation=step.compensation,
        problem=step.problem,
        unknown_attempts=tuple(step.unknown_attempts),
        idempotent=step.spec.idempotent,
    )


def rollback_protocol(
    scope: Scope,
) -> Generator[Command, Any, list[tuple[int, str, BaseException]]]:
    """Undo every completed step of ``scope`` (and its nested scopes), newest first.

    A failing compensation does not stop the others. Returns the failures: steps
    that could not be undone (escalated), except IRREVERSIBLE ones, whose approval
    already accepted that they cannot be undone (they are escalated for the record).
    """
    run = scope.run
    failures: list[tuple[int, str, BaseException]] = []
    for step in run.take_for_unwind(scope):
        error = yield from _undo(run, step, run.compensation_retry)
        if error is not None:
            failures.append((step.id, step.spec.name, error))
    if scope.parent is None:
        yield from run.end_records("escalated" if run.escalations else "rolled_back")
    return failures


def settle_protocol(scope: Scope) -> Generator[Command, Any, None]:
    """Commit the saga: settle steps left UNKNOWN, then write ``saga_end``."""
    run = scope.run
    for step in list(reversed(run.done)):
        if step.state is StepState.UNKNOWN and step.durable:
            run.done.remove(step)
            outcome, _ = yield from resolve_unknown(_target(run, step), run.compensation_retry)
            _settle(run, step, outcome, f"step {step.id} ({step.spec.name}) outcome unknown")
        elif step.unknown_attempts and step.durable and not step.spec.idempotent:
            yield from _escalate(run, step, duplicate_risk(step.spec.name, step.unknown_attempts))
    yield from run.end_records(commit_outcome(run))


def nothing_to_settle(scope: Scope) -> bool:
    """Whether committing the saga is only its ``saga_end`` (no step left to settle).

    Then :func:`settle_protocol` would do nothing but write ``saga_end`` with
    :func:`commit_outcome`; the async driver writes it directly.
    """
    return not any(step.durable and step.unknown_attempts for step in scope.run.done)


def commit_outcome(run: Run) -> str:
    """The ``saga_end`` outcome of a saga that commits: ``escalated`` if any step was."""
    return "escalated" if run.escalations else "committed"
