"""The undo's gate for the undo-gate tests (imported by ``agent-saga undo --import``).

``UNDO_GATE`` says which: ``policy`` (a policy that refuses to undo item B),
``deny`` (an approver that refuses), ``allow`` (an allow-list approver), ``queue``
(the durable approval queue, quorum 2, on the log in ``UNDO_GATE_WAL``).
"""

from __future__ import annotations

import os

from agent_saga import AllowList, ApprovalQueue, ApprovalRequest, Decision, govern_undo


def no_item_b(request: ApprovalRequest) -> str | None:
    """Item B is not to be undone by anyone's undo."""
    if request.tool == "ledger.undo" and request.kwargs.get("item") == "B":
        return "item B is refunded by the finance team only"
    return None


def risk_desk(request: ApprovalRequest) -> Decision:
    """An approver that says no, and why."""
    return Decision.deny("risk-desk", f"no undo of {request.kwargs['saga']} before the audit")


MODE = os.environ.get("UNDO_GATE", "")
if MODE == "policy":
    govern_undo(policies=[no_item_b])
elif MODE == "deny":
    govern_undo(approver=risk_desk)
elif MODE == "allow":
    govern_undo(approver=AllowList(["agent_saga.undo"], name="undo-allow-list"))
elif MODE == "queue":
    govern_undo(approver=ApprovalQueue(os.environ["UNDO_GATE_WAL"], quorum=2, timeout=60))
