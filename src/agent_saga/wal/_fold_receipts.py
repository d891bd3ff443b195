"""Verified compensations in the fold: what a receipt says of a step, and what is in doubt.

A ``compensated`` record may carry a receipt (``docs/log-format.md`` §12.6): the
connector read its inverse back (``verified``), it did not match (``verified:
false``, then an ``escalated``), or the service accepted it but it is not final yet
(``pending``: ``saga-recoveryd`` follows it and writes ``compensation_verified``).
These helpers are pure; :class:`~agent_saga.wal._fold_transitions.FoldTransitions`
applies them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .views import EscalationView, StepView

__all__ = ["apply_compensated", "apply_verified", "doubt_of", "escalation_doubt"]


def apply_compensated(s: StepView, rec: Mapping[str, Any]) -> None:
    """Set ``s``'s verification from a ``compensated`` record."""
    if rec.get("outcome") == "no_effect":
        s.verification, s.receipt, s.verify_reason = None, None, None
        return
    receipt = rec.get("receipt")
    s.receipt = dict(receipt) if isinstance(receipt, dict) else None
    reason = rec.get("reason")
    s.verify_reason = reason if isinstance(reason, str) else None
    if rec.get("pending") is True:
        s.verification = "pending"
    elif rec.get("verified") is True:
        s.verification = "verified"
    elif rec.get("verified") is False:
        s.verification = "unverified"
    else:
        s.verification = "unchecked"


def apply_verified(s: StepView, rec: Mapping[str, Any]) -> bool:
    """Settle ``s``'s pending compensation from a ``compensation_verified`` record.

    Returns:
        Whether it changed anything: only the first final word on the step's
        current compensation (same token) counts; a duplicate (two daemons) does not.
    """
    if s.verification != "pending" or rec["token"] != s.token:
        return False
    s.verification = "verified" if rec["verified"] else "unverified"
    receipt = rec.get("receipt")
    if isinstance(receipt, dict):
        s.receipt = dict(receipt)
    reason = rec.get("reason")
    s.verify_reason = reason if isinstance(reason, str) else None
    return True


def escalation_doubt(rec: Mapping[str, Any], s: StepView | None) -> bool:
    """Whether an ``escalated`` record puts its step's outcome in doubt.

    The writer says so (``doubt: true``); for records written before the field, the
    step itself tells: its call may have landed, or its undo did not verify.
    """
    if rec.get("doubt") is True:
        return True
    if s is None:
        return False
    return s.outcome_unknown or s.verification in ("unverified", "pending")


def doubt_of(steps: Iterable[StepView], open_escalations: Iterable[EscalationView]) -> bool:
    """Whether a saga is in doubt: a pending compensation, or an open doubtful escalation."""
    if any(s.verification == "pending" for s in steps):
        return True
    return any(e.doubt for e in open_escalations)
