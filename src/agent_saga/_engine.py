"""The saga state machine: steps, scopes and the step/rollback protocols, without I/O.

The protocols are generators that *yield commands* (``Append`` a record durably,
``Submit`` one without waiting, ``Call`` user code, ``Approve``, ``Sleep``) and
receive their results. ``_runtime`` drives them with a short sync loop or a short
async loop — the only code that differs by colour (STYLE §1). Everything that
decides *what* happens (gate verdicts, record contents, LIFO order, retry and
escalation) lives here, once.

The REVERSIBLE fast path is not a generator: it does no I/O at all, so it is a
plain function both drivers share.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from . import _crash
from ._registry import accepts_keyword, get_handler, is_registered
from ._types import ActionSemantics, Compensation, Resolution, RetryPolicy
from .errors import (
    ConcurrentWriteDetected,
    GateRefused,
    HandlerNotRegistered,
    InvalidCompensation,
    SagaError,
    SecretInKwargs,
)
from .gate import ApprovalRequest, Decision, as_decision, run_policies
from .secrets import CredentialRef, assert_no_secrets
from .wal import records as R

if TYPE_CHECKING:
    from ._runtime import Run, Scope
    from ._tools import ToolSpec

__all__ = [
    "Append",
    "Approve",
    "Call",
    "Command",
    "Sleep",
    "Step",
    "StepState",
    "Submit",
    "Target",
    "compensation_call",
    "escalate",
    "escalation_id",
    "refusal_protocol",
    "resolve_unknown",
    "reversible_begin",
    "reversible_done",
    "reversible_failed",
    "reversible_gate",
    "revive_refs",
    "rollback_protocol",
    "run_compensation",
    "settle_protocol",
    "step_protocol",
    "undo_compensation",
]

REVERSIBLE: Final = ActionSemantics.REVERSIBLE
COMPENSABLE: Final = ActionSemantics.COMPENSABLE
IRREVERSIBLE: Final = ActionSemantics.IRREVERSIBLE


# --- commands ---------------------------------------------------------------------


class Append:
    """Write ``record`` and wait until it is durable."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record


class Submit:
    """Queue ``record``; it becomes durable, in order, with the next ``Append``."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record


class Call:
    """Call user code ``fn(*args, **kwargs)``; await its result if it is awaitable."""

    __slots__ = ("args", "fn", "kwargs")

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


class Approve:
    """Ask ``approver`` about ``request``; the driver sends back a ``Decision``."""

    __slots__ = ("approver", "request")

    def __init__(self, approver: Callable[..., Any], request: ApprovalRequest) -> None:
        self.approver = approver
        self.request = request


class Sleep:
    """Pause ``seconds`` (a retry backoff)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Command = Append | Submit | Call | Approve | Sleep
Protocol = Generator[Command, Any, Any]


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
    durable = False
    attempts = 0
    unknown_attempts: list[int] = []  # noqa: RUF012 - replaced before any append
    idempotency_key = ""

    def __init__(self, step_id: int, spec: ToolSpec, scope: Scope) -> None:
        self.id = step_id
        self.spec = spec
        self.scope = scope
        self.state = StepState.RUNNING

    def __repr__(self) -> str:
        return f"<Step {self.id} {self.spec.name} {self.state.value}>"


def escalation_id(saga_id: str, step: int | None) -> str:
    """Deterministic escalation id, so the agent and every daemon name it alike."""
    digest = hashlib.sha256(f"agent-saga/escalation/{saga_id}/{step}".encode()).hexdigest()
    return f"esc-{digest[:16]}"


def _now() -> float:
    return time.time()


def _error_text(exc: BaseException) -> str:
    # Exception text can carry anything the tool put there, secrets included.
    from .secrets import redact

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


def _flat(mapping: dict[Any, Any]) -> bool:
    # A plain loop: ``all()`` over a generator costs twice as much on this hot path.
    for k, v in mapping.items():  # noqa: SIM110
        if type(k) is not str or type(v) not in _SCALARS:
            return False
    return True


def _jsonable(value: Any) -> Any:
    """Return ``value`` as it will be logged: JSON, credential references by name."""
    if type(value) is dict and _flat(value):
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
        "reason": decision.reason,
        "ts": _now(),
    }


def step_protocol(
    scope: Scope, spec: ToolSpec, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Protocol:
    """Run one COMPENSABLE or IRREVERSIBLE step durably (SPEC §4).

    gate → INTENT (fsync) → call → factory → COMMITTED (fsync). A call that raised
    is recorded with its outcome (``no_effect`` if the tool declared the exception
    type harmless, else ``unknown``); unknown attempts join the unwind list.
    """
    run = scope.run
    step = Step(run.next_step_id(), spec, scope)
    step.kwargs = _jsonable(spec.bind(args, kwargs))
    step.durable = True
    step.unknown_attempts = []
    step.idempotency_key = R.idempotency_key(run.id, step.id)

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

    call_kwargs = kwargs
    if spec.wants_idempotency_key and "idempotency_key" not in kwargs:
        call_kwargs = {**kwargs, "idempotency_key": step.idempotency_key}
    if spec.capture is not None:
        step.preimage = _jsonable((yield Call(spec.capture, (), step.kwargs)))

    while True:
        step.attempts += 1
        attempt = step.attempts
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
            "ts": _now(),
        }
        if spec.resolver is not None:
            intent["resolver"] = spec.resolver
        if spec.handler is not None:
            intent["handler"] = spec.handler
        if step.preimage is not None:
            intent["preimage"] = step.preimage
        _crash.crashpoint("step.before_intent")
        yield Append(intent)
        _crash.crashpoint("step.after_intent")
        try:
            result = yield Call(fn, args, call_kwargs)
        except BaseException as exc:
            outcome = "no_effect" if spec.is_no_effect(exc) else "unknown"
            _crash.crashpoint("step.after_call_failed")
            yield Submit(
                {
                    "type": R.FORWARD_FAILED,
                    "saga": run.id,
                    "step": step.id,
                    "attempt": attempt,
                    "outcome": outcome,
                    "error": _error_text(exc),
                    "ts": _now(),
                }
            )
            if outcome == "unknown":
                step.unknown_attempts.append(attempt)
                if step.state is StepState.RUNNING:
                    step.state = StepState.UNKNOWN
                    run.done.append(step)
            delay = spec.retry_delay(attempt, exc)
            if delay is None:
                if step.state is StepState.RUNNING:
                    step.state = StepState.NO_EFFECT
                raise
            yield Sleep(delay)
            continue
        _crash.crashpoint("step.after_call")
        break

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
        comp_kwargs = kw if type(kw) is dict and _flat(kw) else _jsonable(dict(kw))
    token = R.recovery_token(run.id, step.id)
    committed = {
        "type": R.COMMITTED,
        "saga": run.id,
        "step": step.id,
        "attempt": attempt,
        "handler": comp.handler if comp is not None else None,
        "kwargs": comp_kwargs,
        "token": token,
        "ts": _now(),
    }
    if problem is not None:
        committed["invalid"] = str(problem)
        step.problem = str(problem)
    # The effect happened: the step joins the unwind list *before* the commit record
    # is written, so a failed or cancelled write still leaves it to be undone.
    if step.state is StepState.UNKNOWN:
        run.done.remove(step)
    step.state = StepState.COMMITTED
    run.done.append(step)
    yield Append(committed)
    _crash.crashpoint("step.after_commit")
    if problem is not None:
        raise problem
    return result


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
        if _jsonable(kwargs) is not kwargs:
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


# --- undo: shared by in-process rollback and the recovery daemon -----------------------


class Target:
    """The step an undo action is about, as in-process rollback and recovery both see it.

    Recovery builds it from the log (``StepView``); rollback from the live ``Step``.
    """

    __slots__ = ("by", "idempotency_key", "kwargs", "preimage", "resolver", "saga", "step", "tool")

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
    ) -> None:
        self.saga = saga
        self.step = step
        self.tool = tool
        self.by = by
        self.resolver = resolver
        self.kwargs = dict(kwargs or {})
        self.preimage = preimage
        self.idempotency_key = idempotency_key

    @property
    def token(self) -> str:
        """The step's deterministic recovery token."""
        return R.recovery_token(self.saga, self.step)


def escalate(saga_id: str, step: int | None, reason: str, by: str) -> Protocol:
    """Put one item on the durable human queue (deterministic id: no duplicates)."""
    yield Append(
        {
            "type": R.ESCALATED,
            "saga": saga_id,
            "step": step,
            "escalation": escalation_id(saga_id, step),
            "reason": reason,
            "by": by,
            "ts": _now(),
        }
    )


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
    token = t.token
    try:
        fn, kwargs = compensation_call(comp, token)
    except HandlerNotRegistered as exc:
        return exc
    if durable:
        yield Append(
            {
                "type": R.COMPENSATING,
                "saga": t.saga,
                "step": t.step,
                "token": token,
                "by": t.by,
                "ts": _now(),
            }
        )
    attempt = 0
    while True:
        attempt += 1
        _crash.crashpoint("rollback.before_compensation")
        try:
            yield Call(fn, (), kwargs)
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
                        "error": _error_text(exc),
                        "final": delay is None,
                        "ts": _now(),
                    }
                )
            if delay is None:
                return exc
            yield Sleep(delay)
            continue
        _crash.crashpoint("rollback.after_compensation")
        if durable:
            yield Append(
                {
                    "type": R.COMPENSATED,
                    "saga": t.saga,
                    "step": t.step,
                    "token": token,
                    "by": t.by,
                    "ts": _now(),
                }
            )
        return None


def undo_compensation(
    t: Target, comp: Compensation, policy: RetryPolicy
) -> Generator[Command, Any, tuple[str, BaseException | None]]:
    """Compensate a committed step; escalate it if that fails for good.

    Returns:
        ``("compensated", None)`` or ``("escalated", error)``.
    """
    error = yield from run_compensation(t, comp, policy)
    if error is None:
        return "compensated", None
    if isinstance(error, HandlerNotRegistered):
        reason = f"handler not registered: {comp.handler!r}"
    elif isinstance(error, ConcurrentWriteDetected):
        reason = f"concurrent writer detected while undoing {t.tool!r}: {_error_text(error)}"
    else:
        reason = f"compensation of {t.tool!r} failed past its retry budget: {_error_text(error)}"
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
        yield from escalate(t.saga, t.step, f"handler not registered: {t.resolver!r}", t.by)
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
            t.saga, t.step, f"resolver {t.resolver!r} raised {_error_text(exc)}", t.by
        )
        return "escalated", exc
    if not isinstance(verdict, Resolution) or verdict.outcome == "undecided":
        why = (
            verdict.reason
            if isinstance(verdict, Resolution)
            else (f"resolver returned {type(verdict).__name__}, not Resolution")
        )
        yield from escalate(t.saga, t.step, f"resolver undecided: {why}", t.by)
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
                "ts": _now(),
            }
        )
        return "no_effect", None
    assert verdict.compensation is not None
    return (yield from undo_compensation(t, verdict.compensation, policy))


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
    if step.problem is not None and step.compensation is None:
        yield from _escalate(run, step, f"cannot undo {step.spec.name!r}: {step.problem}")
        return InvalidCompensation(step.problem, saga_id=run.id, step_id=step.id)
    if not step.durable:  # REVERSIBLE: in-process only
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
            f"restore of REVERSIBLE step {step.spec.name!r} failed: {_error_text(error)}",
        )
        return error
    if step.state is StepState.UNKNOWN:
        outcome, error = yield from resolve_unknown(_target(run, step), policy)
        _settle(run, step, outcome, f"step {step.id} ({step.spec.name}) outcome unknown")
        if outcome == "escalated":
            return error or _unresolved(run, step)
        return None
    if step.spec.semantics is IRREVERSIBLE:
        yield from _escalate(
            run,
            step,
            f"IRREVERSIBLE step {step.spec.name!r} completed in a saga that rolled "
            "back; it cannot be undone automatically",
        )
        return None
    if step.compensation is None:
        yield from _escalate(run, step, f"no valid compensation for {step.spec.name!r}")
        return InvalidCompensation(
            f"{step.spec.name!r} has no valid compensation", saga_id=run.id, step_id=step.id
        )
    outcome, error = yield from undo_compensation(_target(run, step), step.compensation, policy)
    _settle(run, step, outcome, f"step {step.id} ({step.spec.name}) compensation failed")
    if error is None and step.unknown_attempts and not step.spec.idempotent:
        yield from _escalate(run, step, _duplicate_risk(step))
        return _unresolved(run, step)
    return error


def _duplicate_risk(step: Step) -> str:
    return (
        f"{step.spec.name!r} attempts {step.unknown_attempts} raised with unknown outcome "
        "before a later attempt succeeded; the effect may have happened more than once "
        "(declare idempotent=True if the service dedupes by idempotency key)"
    )


def _unresolved(run: Run, step: Step) -> SagaError:
    return SagaError(
        f"step {step.id} ({step.spec.name}) has an unknown outcome and was escalated",
        saga_id=run.id,
        step_id=step.id,
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
            yield from _escalate(run, step, _duplicate_risk(step))
    yield from run.end_records("escalated" if run.escalations else "committed")
