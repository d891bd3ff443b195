"""The gate an undo goes through: moving money back is moving money (``docs/undo.md``).

An undo of a committed saga runs compensations — refunds, restores, deletions — so it
is judged like a step: by policies, then by an approver, before anything is written
(``docs/log-format.md`` §12.5). Two kinds of question are asked:

* **the undo as a whole**: an :class:`~agent_saga.gate.ApprovalRequest` for the tool
  :data:`~agent_saga.wal.records.UNDO_TOOL` (``agent_saga.undo``), step 0, whose
  kwargs are the saga, the reason, the steps and every compensation's handler and
  kwargs (credentials as references). Policies see it, and the approver answers it —
  an :class:`~agent_saga.approvals.ApprovalQueue` as approver brings its durable
  record, expiry and quorum;
* **each compensation**: one request per step, for the compensation's handler with
  its kwargs, semantics COMPENSABLE — so ``MaxArgument("amount", 500)`` caps what one
  undo may refund, like it caps a charge.

The first policy that objects refuses the undo; then the approver, if there is one,
must approve. Every refusal and every approver's decision is a ``gate`` record of
the saga (step 0, tool ``agent_saga.undo``): who decided and why stay in its
history; an approval is also written into ``undo_requested`` (``approved_by``,
``approval``). Which policies and approver apply: the ``policies=`` / ``approver=``
of :func:`~agent_saga.undo_saga`, else those set for the process with
:func:`govern_undo` (a module imported by ``agent-saga undo --import`` or
``agent-saga ui --import`` sets them), else none (the undo is not gated beyond the
halt).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._runtime import _call_blocking
from ._types import ActionSemantics
from .errors import GateRefused, SagaUsageError
from .gate import ApprovalRequest, Approver, Decision, Policy, as_decision, run_policies
from .wal.halts import halts_in_force
from .wal.records import UNDO_TOOL

if TYPE_CHECKING:
    from ._undo_plan import UndoPlan
    from .wal.store import LogStore

__all__ = ["UndoGate", "gate_text", "govern_undo", "judge", "refuse_if_halted", "undo_gate"]


@dataclass(frozen=True, slots=True)
class UndoGate:
    """The policies and the approver an undo goes through.

    Attributes:
        policies: Checked in order; the first that objects refuses.
        approver: Asked once for the whole undo when the policies pass (None: none).
    """

    policies: tuple[Policy, ...] = ()
    approver: Approver | None = None

    @property
    def empty(self) -> bool:
        """True when nothing judges an undo."""
        return not self.policies and self.approver is None


_lock = threading.Lock()
_process_gate = UndoGate()


def _checked(policies: Iterable[Policy] | None, approver: Approver | None) -> UndoGate:
    given: object = () if policies is None else policies
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise SagaUsageError("policies must be a list of policies (callables)")
    found: tuple[Any, ...] = tuple(given)
    for p in found:
        if not callable(p):
            raise SagaUsageError(f"an undo policy must be callable, not {type(p).__name__}")
    if approver is not None and not callable(approver):
        raise SagaUsageError(f"an undo approver must be callable, not {type(approver).__name__}")
    return UndoGate(found, approver)


def govern_undo(
    *, policies: Iterable[Policy] | None = None, approver: Approver | None = None
) -> None:
    """Set the policies and approver every undo in this process goes through.

    Call it in the module that registers your compensation handlers, and pass that
    module to ``agent-saga undo --import`` and ``agent-saga ui --import``: then the
    command line and the debugger judge undos the way your code does.

    Args:
        policies: Policies (``MaxArgument``, your own callables), asked about the whole
            undo (tool ``agent_saga.undo``) and about each compensation.
        approver: Asked once for the whole undo (an ``ApprovalQueue`` for a durable,
            quorum-capable approval); None: no approver.

    Raises:
        SagaUsageError: a policy or the approver is not callable.
    """
    global _process_gate
    gate = _checked(policies, approver)
    with _lock:
        _process_gate = gate


def undo_gate(
    policies: Iterable[Policy] | None = None, approver: Approver | None = None
) -> UndoGate:
    """The gate of one undo: the given policies/approver, else the process's.

    Raises:
        SagaUsageError: a policy or the approver is not callable.
    """
    if policies is None and approver is None:
        with _lock:
            return _process_gate
    return _checked(policies, approver)


def requests(plan: UndoPlan) -> tuple[ApprovalRequest, list[ApprovalRequest]]:
    """The questions an undo asks: the whole undo, then each compensation."""
    comps = [s for s in plan.steps if s.action != "cannot_undo" and s.handler]
    whole = ApprovalRequest(
        saga_id=plan.saga_id,
        saga_name=plan.name or "",
        tool=UNDO_TOOL,
        semantics=ActionSemantics.COMPENSABLE,
        kwargs={
            "saga": plan.saga_id,
            "undo": plan.undo,
            "from_step": plan.from_step,
            "reason": plan.reason,
            "steps": plan.durable_steps,
            "compensations": [
                {"step": s.step, "handler": s.handler, "kwargs": dict(s.kwargs)} for s in comps
            ],
        },
        step=0,
        side_effects=len(comps),
    )
    each = [
        ApprovalRequest(
            saga_id=plan.saga_id,
            saga_name=plan.name or "",
            tool=str(s.handler),
            semantics=ActionSemantics.COMPENSABLE,
            kwargs=dict(s.kwargs),
            step=s.step if s.step is not None else 0,
            side_effects=len(comps),
        )
        for s in comps
    ]
    return whole, each


def check_policies(gate: UndoGate, plan: UndoPlan) -> Decision | None:
    """The first policy's refusal of the undo or of one of its compensations, or None."""
    whole, each = requests(plan)
    for request in (whole, *each):
        refusal = run_policies(gate.policies, request)
        if refusal is not None:
            if request is not whole:
                what = f"step {request.step}'s compensation {request.tool}"
                refusal = Decision(False, refusal.decided_by, f"{what}: {refusal.reason}")
            return refusal
    return None


def ask_approver(gate: UndoGate, plan: UndoPlan) -> Decision | None:
    """The approver's decision on the whole undo (None: there is no approver)."""
    if gate.approver is None:
        return None
    whole, _ = requests(plan)
    try:
        verdict: Any = _call_blocking(gate.approver, (whole,), {})  # an async one too
    except SagaUsageError:
        raise
    except Exception as exc:  # a broken approver must not open the gate
        return Decision(False, "approver", f"the approver raised {type(exc).__name__}; refused")
    return as_decision(verdict, source=gate.approver)


def gate_record(plan: UndoPlan, decision: Decision, now: float) -> dict[str, Any]:
    """The ``gate`` record of a decision about an undo (step 0, tool ``agent_saga.undo``)."""
    return {
        "type": "gate",
        "saga": plan.saga_id,
        "step": 0,
        "tool": UNDO_TOOL,
        "semantics": ActionSemantics.COMPENSABLE.value,
        "decision": "approved" if decision.approved else "refused",
        "decided_by": decision.decided_by,
        "reason": decision.reason,
        "undo": plan.undo,
        "ts": now,
    }


def refused(plan: UndoPlan, decision: Decision) -> GateRefused:
    """The error an undo refused by its gate raises."""
    return GateRefused(
        f"the undo of saga {plan.saga_id} was refused by {decision.decided_by}: "
        f"{decision.reason} (recorded; nothing was compensated)",
        tool=UNDO_TOOL,
        reason=decision.reason,
        decided_by=decision.decided_by,
    )


def approval_fields(decision: Decision) -> Mapping[str, Any]:
    """What ``undo_requested`` records of an approver's approval."""
    out: dict[str, Any] = {"approved_by": decision.decided_by}
    if decision.approval is not None:
        out["approval"] = dict(decision.approval)
    return out


def gate_text(gate: UndoGate, refusal: Decision | None) -> str | None:
    """What a dry run says about the gate (``UndoPlan.gate``)."""
    if refusal is not None:
        return f"refused by {refusal.decided_by}: {refusal.reason}"
    if gate.approver is not None:
        name = getattr(gate.approver, "name", None) or getattr(
            gate.approver, "__name__", type(gate.approver).__name__
        )
        return f"the approver ({name}) is asked before anything is done"
    return None


def judge(
    store: LogStore, plan: UndoPlan, gate: UndoGate, refusal: Decision | None, encryptor: Any
) -> Mapping[str, Any] | None:
    """Refuse (recorded) or approve an undo; what ``undo_requested`` records of it.

    Raises:
        GateRefused: a policy or the approver refused (its ``gate`` record written).
    """
    decision = refusal if refusal is not None else ask_approver(gate, plan)
    if decision is None:
        return None  # no approver, no objection: approved by the gate alone
    writer = store.writer(encryptor=encryptor)
    writer.append(gate_record(plan, decision, store.now()))
    if not decision.approved:
        raise refused(plan, decision)
    return approval_fields(decision)


def refuse_if_halted(store: LogStore, saga_name: str | None, encryptor: Any) -> None:
    """An undo moves money back: a halt that covers it refuses it (``docs/governance.md``)."""
    if store.kind not in ("file", "postgresql"):
        return  # the in-memory test log has no halts
    host = socket.gethostname()
    for h in halts_in_force(store, encryptor=encryptor):
        if h.covers(tool=UNDO_TOOL, saga_name=saga_name, host=host):
            raise SagaUsageError(
                f"the log is halted for {h.describe()} by {h.by}: {h.reason}; an undo is a "
                "side effect too. Lift it with `agent-saga resume --reason ...`, then undo"
            )
