"""How a saga ends in-process: rolled back, or settled and committed, without I/O.

:func:`rollback_protocol` undoes the completed steps of a scope newest first; a
failing compensation does not stop the others, and what cannot be undone is
escalated. :func:`settle_protocol` commits a saga: steps whose outcome is still
unknown are settled through their resolver first, then ``saga_end`` is written.
Both are protocol generators (``_commands``) like the step protocol of
:mod:`agent_saga._engine`, driven by ``_runtime``'s loops. Undoing one durable
step is ``_undo``'s, shared with the recovery daemon.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from ._commands import Command, Protocol
from ._engine import Step, StepState
from ._types import Compensation, RetryPolicy
from ._undo import (
    StepFacts,
    Target,
    duplicate_risk,
    error_text,
    escalate,
    resolve_unknown,
    run_compensation,
    undo_durable_step,
)
from .errors import InvalidCompensation, OutcomeUnknown

if TYPE_CHECKING:
    from ._runtime import Run, Scope

__all__ = ["commit_outcome", "nothing_to_settle", "rollback_protocol", "settle_protocol"]


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
        trace=None if step.obs is None else step.obs.traceparent,
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
        trace = None if step.obs is None else step.obs.traceparent
        t = Target(run.id, step.id, step.spec.name, "in-process", trace=trace)
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
    if run.deferred:  # deferred calls of what rolls back never run (_deferred.py)
        run.deferred = [p for p in run.deferred if not p.scope.within(scope)]
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
