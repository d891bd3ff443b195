"""The REVERSIBLE fast path: a step that logs nothing, undone in-process.

A REVERSIBLE call does no I/O at all — no record, no approver — so this is not a
protocol generator but plain functions both drivers share (``@tool``'s sync and
async wrappers call them directly): :func:`reversible_begin` takes the in-process
snapshot before the call, :func:`reversible_done` or :func:`reversible_failed`
puts the step on the saga's unwind list after it. Only the scope's policies apply
to such a call (:func:`reversible_gate`); a refusal is recorded durably all the
same, by :func:`agent_saga._engine.refusal_protocol`. The rollback undoes these
steps with the others (:mod:`agent_saga._rollback`).
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, Final

from . import _observe
from ._engine import Step, StepState
from ._types import ActionSemantics, Compensation
from .errors import InvalidCompensation
from .gate import ApprovalRequest, Decision, run_policies

if TYPE_CHECKING:
    from ._runtime import Scope
    from ._tools import ToolSpec

__all__ = ["reversible_begin", "reversible_done", "reversible_failed", "reversible_gate"]

REVERSIBLE: Final = ActionSemantics.REVERSIBLE


def reversible_gate(scope: Scope, spec: ToolSpec, args: Any, kwargs: Any) -> Decision | None:
    """Run the scope's and the tool's policies for a REVERSIBLE call; the refusal, if any.

    Only called when there are policies: REVERSIBLE calls log nothing, so the
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
    policies = scope.policies + spec.policies if spec.policies else scope.policies
    return run_policies(policies, request)


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
    obs = _observe.observer
    if obs is not None:
        step.obs = obs.step_started(step, args, kwargs)
    return step


def reversible_failed(step: Step) -> None:
    """A REVERSIBLE call raised: if a snapshot exists, restoring it is still exact.

    Called from the ``except`` block around the call (the observer reads the error).
    """
    if step.obs is not None:
        step.obs.finish(sys.exc_info()[1])
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
            error = InvalidCompensation(problem, saga_id=step.scope.run.id, step_id=step.id)
            if step.obs is not None:
                step.obs.finish(error)
            raise error from exc
        if type(comp) is not Compensation and not isinstance(comp, Compensation):
            problem = (
                f"compensation factory of {step.spec.name!r} returned "
                f"{type(comp).__name__}, not Compensation"
            )
            _keep_invalid(step, problem)
            error = InvalidCompensation(problem, saga_id=step.scope.run.id, step_id=step.id)
            if step.obs is not None:
                step.obs.finish(error)
            raise error
        step.compensation = comp
    step.state = StepState.COMMITTED
    if step.obs is not None:
        step.obs.finish(None)
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
