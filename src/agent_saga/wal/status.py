"""One vocabulary for the state of a saga and of a step, and how a saga's status is derived.

Pure: no I/O, no clock. ``docs/concepts.md`` ("States") holds the same names as tables
with how each state is entered and left; ``tests/test_status_vocabulary.py`` checks
that the tables, this module, the fold, ``agent-saga runs`` and the debugger UI
agree.

**Status is derived; the outcome is recorded.** ``saga_end.outcome`` (``committed`` /
``rolled_back`` / ``escalated``) is what the process that ended the saga wrote, and
never changes. A saga's *status* is what is true of it now, from all of its records:
an escalation closed later, a retry that undid a step, a daemon's claim. Who did
what and when is its *history* (:class:`~agent_saga.wal.views.HistoryEvent`), not
its status: a saga that escalated, was retried and was compensated by
``saga-recoveryd`` is ``rolled_back``, and its history says so.

Three readers derive a status, in layers:

* :class:`~agent_saga.wal.state.SagaFold` from the log alone (:func:`live_status`,
  :func:`ended_status`): every state but ``orphaned``; ``recovering`` once a daemon's
  claim is recorded and its work is not done, since the log cannot say whether the
  claim has expired;
* :func:`agent_saga.recovery.liveness.liveness` adds the owner's lease and the clock:
  ``orphaned``, and a claim that expired;
* the UI's index asks the same two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .views import ClaimView, EscalationView

__all__ = [
    "COMMITTED",
    "ESCALATED",
    "ESCALATION_STATES",
    "HISTORY_EVENTS",
    "IN_DOUBT",
    "LOGGED_STATUSES",
    "ORPHANED",
    "RECOVERING",
    "RESOLVED",
    "ROLLED_BACK",
    "ROLLING_BACK",
    "RUNNING",
    "SAGA_STATES",
    "SAGA_STATUSES",
    "STEP_STATES",
    "UNDOING",
    "UNDONE",
    "ended_status",
    "escalation_state",
    "live_status",
    "retry_claim",
]

RUNNING: Final = "running"
ROLLING_BACK: Final = "rolling_back"
RECOVERING: Final = "recovering"
ORPHANED: Final = "orphaned"
ESCALATED: Final = "escalated"
IN_DOUBT: Final = "in_doubt"
RESOLVED: Final = "resolved"
ROLLED_BACK: Final = "rolled_back"
COMMITTED: Final = "committed"
UNDOING: Final = "undoing"
UNDONE: Final = "undone"

SAGA_STATES: Final[Mapping[str, str]] = MappingProxyType(
    {
        RUNNING: "not ended; its owner is alive and has written no undo record",
        ROLLING_BACK: "not ended; its owner is alive and is writing undo records",
        RECOVERING: "a saga-recoveryd claim is unexpired: a daemon is rolling it back, "
        "or carrying out an operator's retry of one of its escalations",
        ORPHANED: "not ended, no live owner and no daemon: the next saga-recoveryd "
        "pass takes it over",
        IN_DOUBT: "ended, and a step's outcome is not known: a compensation accepted but "
        "not final yet (saga-recoveryd follows it), one that did not read back as undone, "
        "or a step whose call may have landed — with an escalation open for a person",
        ESCALATED: "an escalation is open: a person must act",
        RESOLVED: "ended; every escalation is closed, at least one by a person "
        "(`escalations resolve`), who took responsibility for what the library did not undo",
        ROLLED_BACK: "ended, and every effect was undone or proven absent (by its owner, "
        "by saga-recoveryd, or by a retry); no escalation open",
        COMMITTED: "ended committed; no escalation open",
        UNDOING: "ended committed, and an undo of its steps was asked (`agent-saga undo`) "
        "and is not done yet: its undoer, or saga-recoveryd after it, is compensating them",
        UNDONE: "ended committed, then undone: an undo compensated the steps it was asked "
        "to; no escalation open",
    }
)
"""Every status a saga can have, with its meaning, in the order the UI lists them."""

SAGA_STATUSES: Final[tuple[str, ...]] = tuple(SAGA_STATES)
"""The names of :data:`SAGA_STATES` (what ``runs --status`` and ``?status=`` accept)."""

LOGGED_STATUSES: Final[tuple[str, ...]] = tuple(s for s in SAGA_STATUSES if s != ORPHANED)
"""The statuses the log alone can show (``SagaFold``; ``runs --json`` ``logged_status``)."""

STEP_STATES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "gated": "the gate approved it; no call recorded yet",
        "refused": "the gate refused it: never called",
        "intent": "called, and no outcome recorded: it may or may not have happened",
        "committed": "the call returned; its compensation is recorded",
        "no_effect": "the call failed and provably did nothing",
        "unknown": "the call failed and may have landed",
        "compensating": "its compensation started",
        "compensated": "its compensation finished (or a resolver proved nothing landed)",
        "compensation_failed": "its compensation failed (retried unless final)",
        "escalated": "a person must decide what happened to it (stays so once resolved: "
        "the saga's status says resolved)",
    }
)
"""Every state of a step (``StepView.state``), in lifecycle order."""

HISTORY_EVENTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "started": "saga_begin: the owner started it",
        "claimed": "a saga-recoveryd took it over, or took up an operator's retry",
        "escalated": "an escalation was opened (or opened again by a failed retry)",
        "ended": "saga_end, with its outcome",
        "retry_requested": "an operator asked recovery to retry an escalated step",
        "compensated": "a step was undone after the saga ended (a retry, or an undo)",
        "compensation_failed": "a retry's compensation failed for good",
        "resolved": "an escalation was closed: by a person, or by the daemon after a retry",
        "undo_requested": "a person asked to undo the committed saga (who, why, which steps)",
        "undone": "an undo after commit ended (undone, or escalated)",
        "undo_gated": "the gate decided about an undo: a policy or an approver refused it, "
        "or an approver approved it (who, why)",
        "deferred": "a defer=True call was gated and recorded; it runs once the saga commits",
        "deferred_done": "a deferred call ran after the commit (done), or was escalated",
        "compensation_verified": "a pending compensation became final: verified, or not "
        "(then escalated)",
    }
)
"""What a saga's ``history`` lists, one entry per fact (``SagaView.history``)."""

OPEN: Final = "open"
RETRYING: Final = "retrying"
CLOSED_BY_PERSON: Final = "closed_by_person"
CLOSED_BY_COMPENSATION: Final = "closed_by_compensation"
ESCALATION_STATES: Final = (OPEN, RETRYING, CLOSED_BY_PERSON, CLOSED_BY_COMPENSATION)
"""What :func:`escalation_state` says of one escalation."""


def retry_claim(e: EscalationView) -> ClaimView | None:
    """The claim of the daemon carrying out a retry of ``e``, while that retry is not done.

    Args:
        e: An escalation as the fold holds it.

    Returns:
        The retry's claim (unexpired or not: the log cannot tell), or None.
    """
    r = e.retry
    if e.resolved or r is None or r.outcome is not None:
        return None
    return r.claim


def escalation_state(e: EscalationView) -> str:
    """Whether ``e`` is open, being retried, or closed, and by whom.

    An escalation is closed *by compensation* when the daemon that claimed an
    operator's retry of it resolved it: the retry undid the step (or its resolver
    proved nothing landed). Any other resolution is a person's.

    Args:
        e: An escalation as the fold holds it.

    Returns:
        One of :data:`ESCALATION_STATES`.
    """
    if not e.resolved:
        return RETRYING if retry_claim(e) is not None else OPEN
    r = e.retry
    claim = None if r is None or r.outcome != "resolved" else r.claim
    if claim is not None and claim.by == e.resolved_by:
        return CLOSED_BY_COMPENSATION
    return CLOSED_BY_PERSON


def live_status(*, claimed: bool, undoing: bool) -> str:
    """The status the log alone gives a saga without ``saga_end``.

    Args:
        claimed: A daemon's ``claim`` is recorded.
        undoing: An undo record (``compensating`` / ``compensated`` /
            ``compensation_failed``) is recorded.

    Returns:
        ``recovering``, ``rolling_back`` or ``running``.
    """
    if claimed:
        return RECOVERING
    return ROLLING_BACK if undoing else RUNNING


def ended_status(
    outcome: str, escalations: Iterable[str], undo: str | None = None, *, doubt: bool = False
) -> str:
    """The status of a saga with ``saga_end``, from its outcome and its escalations.

    In order: ``recovering`` while a daemon carries out a retry; ``escalated`` while
    any escalation is open (whatever the outcome: a committed saga with a late
    escalation too); ``resolved`` once a person closed one; else the outcome, except
    that a saga that ended ``escalated`` and whose escalations were all closed by
    retries that undid their steps is ``rolled_back``. A saga that ended
    ``escalated`` without any escalation the reader knows of stays ``escalated``
    (fail closed). An undo after commit: ``undoing`` while it is open (before
    ``escalated``: its own escalations are part of it), ``undone`` once done with no
    escalation open. ``in_doubt`` (after ``undoing``, before ``escalated``) while a
    step's outcome is not known: a pending compensation, or an open escalation of a
    step whose outcome is unknown or whose undo did not verify.

    Args:
        outcome: ``saga_end.outcome``.
        escalations: :func:`escalation_state` of each of its escalations.
        undo: ``"open"`` while an undo after commit is not done, ``"undone"`` once
            one ended undone, else None.
        doubt: A step's outcome is in doubt (see above).

    Returns:
        One of :data:`SAGA_STATUSES`.
    """
    seen = set(escalations)
    if RETRYING in seen:
        return RECOVERING
    if undo == "open":
        return UNDOING
    if doubt:
        return IN_DOUBT
    if OPEN in seen:
        return ESCALATED
    if CLOSED_BY_PERSON in seen:
        return RESOLVED
    if undo == "undone":
        return UNDONE
    if outcome in (COMMITTED, ROLLED_BACK):
        return outcome
    return ROLLED_BACK if CLOSED_BY_COMPENSATION in seen else ESCALATED
