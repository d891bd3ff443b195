"""The gate of one step: the automatic checks, the approver, limits, and the records.

What the engine's protocols (``_engine``, ``_deferred``) yield or call before a
COMPENSABLE or IRREVERSIBLE step is entered: a halt in scope, a missing compensation
or handler, a secret in the kwargs and the saga's and tool's policies refuse it
(:func:`precheck`); an IRREVERSIBLE step, or a call over a limit whose
``over_limit`` is ``"approve"``, asks the saga's approver (:func:`ask_approver`,
:func:`over_limit`); a refusal is recorded durably (:func:`refuse`,
:func:`gate_record`) and raised (:func:`refusal`). No I/O here: records are
yielded to the driver.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from . import _observe
from ._commands import Append, Approve, Command, Protocol, Submit
from ._metering import Metered
from ._registry import is_registered
from ._types import ActionSemantics
from ._undo import now
from .errors import GateRefused, SecretInKwargs
from .gate import ApprovalRequest, Decision, Policy, as_decision, deny_all, run_policies
from .secrets import assert_no_secrets, redact
from .wal import records as R
from .wal.halts import halt_blocking
from .wal.limits import Overrun

if TYPE_CHECKING:
    from ._engine import Step
    from ._runtime import Run, Scope
    from ._tools import ToolSpec

__all__ = [
    "IN_PROCESS_TTL",
    "approval_records",
    "approval_request",
    "ask_approver",
    "gate_record",
    "over_limit",
    "policies_of",
    "precheck",
    "refusal",
    "refuse",
]

COMPENSABLE: Final = ActionSemantics.COMPENSABLE
#: The ``ttl`` of the request an in-process approver answered within its call.
IN_PROCESS_TTL: Final = 300.0


def refuse(run: Run, step: Step, decision: Decision) -> Protocol:
    yield from run.begin_records()
    yield Append(gate_record(run, step, decision))
    raise refusal(run, step, decision)


def refusal(run: Run, step: Step, decision: Decision) -> GateRefused:
    cls = SecretInKwargs if decision.decided_by == "secret-scan" else GateRefused
    return cls(
        f"gate refused {step.spec.name!r}: {decision.reason}",
        tool=step.spec.name,
        reason=decision.reason,
        decided_by=decision.decided_by,
        saga_id=run.id,
        step_id=step.id,
    )


def approval_request(run: Run, spec: ToolSpec, step: Step) -> ApprovalRequest:
    return ApprovalRequest(
        run.id, run.name, spec.name, spec.semantics, step.kwargs, step.id, run.side_effects
    )


def precheck(run: Run, scope: Scope, spec: ToolSpec, step: Step) -> Decision | None:
    """The gate's automatic checks; return the refusal, or None when all pass."""
    halt = halt_blocking(run.log(), tool=spec.name, saga_name=run.name)
    if halt is not None:
        if halt.unwind:
            run.halted = halt.halt  # the saga rolls back at its end, whatever the body does
        return Decision.deny(
            f"halt:{halt.halt}",
            f"the log is halted for {halt.describe()} by {halt.by}: {halt.reason} "
            f"(lift it with `agent-saga resume --reason ...`)",
        )
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
    policies = policies_of(scope, spec)
    if policies:
        return run_policies(policies, approval_request(run, spec, step))
    return None


def policies_of(scope: Scope, spec: ToolSpec) -> tuple[Policy, ...]:
    """The saga's policies and the tool's own (``@tool(policies=...)``), in that order."""
    return scope.policies + spec.policies if spec.policies else scope.policies


def ask_approver(
    run: Run, scope: Scope, spec: ToolSpec, step: Step, usage: dict[str, Any] | None = None
) -> Generator[Command, Any, Decision]:
    """Ask the saga's approver about an IRREVERSIBLE step, or a call over a limit.

    Fail closed: an approver that raises refuses.
    """
    obs = _observe.observer
    if obs is not None:
        obs.approval_waiting(1)
    request = approval_request(run, spec, step)
    if usage is not None:
        request = replace(request, usage=usage)
    asked = now()
    try:
        answer = yield Approve(scope.approver, request)
    except Exception as exc:  # a broken approver must not open the gate
        answer = Decision.deny("approver", f"approver raised {type(exc).__name__}; refused")
    finally:
        if obs is not None:
            obs.approval_waiting(-1)
    decision = as_decision(answer, source=scope.approver)
    if decision.approval is None and _records_for(scope.approver):
        # One record for every approver (§12.3): the request and its decision, asked
        # and answered within this call; the intent names it.
        records, approval = approval_records(run, request, decision, scope.approver, asked)
        yield from run.begin_records()  # the saga's first record stays its saga_begin
        for record in records:
            yield Submit(record)
        decision = replace(decision, approval=approval)
    if step.obs is not None:
        step.obs.approval(decision, scope.approver)
    return decision


def _records_for(approver: object) -> bool:
    """Whether the gate writes the approval records of ``approver``'s decisions.

    An approver says no with ``gate_records = False``: ``ApprovalQueue`` (it writes its
    own), and the default :func:`~agent_saga.gate.deny_all` (no approver was
    configured: nobody was asked).
    """
    return approver is not deny_all and getattr(approver, "gate_records", True) is not False


def approval_records(
    run: Run, request: ApprovalRequest, decision: Decision, approver: object, asked: float
) -> tuple[list[dict[str, Any]], Mapping[str, Any]]:
    """``approval_requested`` and ``approval_decided`` of an in-process approver's answer.

    The same records an ``ApprovalQueue`` and ``agent-saga approvals`` write
    (``docs/log-format.md`` §12.3): bound to the call's digest, decided by
    ``decision.decided_by`` with the approver's ``identity_how`` (default
    ``approver``). Written after the answer, so no other decider ever sees the
    request open.

    Returns:
        The two records, and the ``{request, digest}`` the intent records.
    """
    kwargs = dict(request.kwargs)
    semantics = request.semantics.value
    digest = R.call_digest(request.saga_id, request.step, request.tool, semantics, kwargs)
    purpose = "approval" if request.usage is None else "approval/limit"
    rid = R.approval_id(request.saga_id, request.step, purpose, digest)
    how = getattr(approver, "identity_how", None)
    requested: dict[str, Any] = {
        "type": R.APPROVAL_REQUESTED,
        "saga": request.saga_id,
        "name": request.saga_name,
        "step": request.step,
        "tool": request.tool,
        "semantics": semantics,
        "kwargs": kwargs,
        "request": rid,
        "digest": digest,
        "quorum": 1,
        "ttl": IN_PROCESS_TTL,
        "expires": asked + IN_PROCESS_TTL,
        "agent": {"host": socket.gethostname(), "pid": os.getpid()},
        "approver": getattr(approver, "name", None) or type(approver).__name__,
        "by": run.owner_label(),
        "ts": asked,
    }
    if request.usage is not None:
        requested["usage"] = dict(request.usage)
    decided = {
        "type": R.APPROVAL_DECIDED,
        "request": rid,
        "saga": request.saga_id,
        "digest": digest,
        "decision": "approved" if decision.approved else "denied",
        "by": decision.decided_by,
        "identity": {
            "how": how if isinstance(how, str) and how else "approver",
            "name": decision.decided_by,
        },
        "note": redact(decision.reason),
        "ts": max(now(), asked),
    }
    return [requested, decided], {"request": rid, "digest": digest}


def over_limit(
    run: Run,
    scope: Scope,
    spec: ToolSpec,
    step: Step,
    intent: dict[str, Any],
    metered: Metered,
    over: Overrun,
) -> Protocol:
    """A call over a limit: refused, or — ``over_limit="approve"`` — the approver decides.

    Approved, the intent (or a deferred step's ``deferred`` record) is appended as it
    is (its reservation counts, past the limit) and a ``gate`` record says who let it
    through; refused, the refusal is recorded with the limit's numbers and raised
    (and the step no longer counts in ``run.side_effects``).
    """
    usage = over.as_record()
    decision = Decision.deny(f"limit:{over.usage.limit}", over.reason())
    if metered[over.usage.limit][3] == "approve":
        decision = yield from ask_approver(run, scope, spec, step, usage=usage)
        if decision.approved:
            intent["approved_by"] = decision.decided_by
            if decision.approval is not None:
                intent["approval"] = dict(decision.approval)  # §12.3: what it runs under
            yield Submit({**gate_record(run, step, decision), "limit": usage})
            yield Append(intent)
            return
        decision = Decision.deny(decision.decided_by, f"{over.reason()}; {decision.reason}")
    run.side_effects -= 1
    yield Append({**gate_record(run, step, decision), "limit": usage})
    raise refusal(run, step, decision)


def gate_record(run: Run, step: Step, decision: Decision) -> dict[str, Any]:
    if step.obs is not None:
        step.obs.gate(decision)
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
