"""The human queue: list open escalations and record a human's decision."""

from __future__ import annotations

import time
from typing import Any

from ..errors import SagaUsageError
from ..gate import current_user
from ..secrets import redact
from ..wal import records as R
from ..wal.state import EscalationView, fold_file
from ..wal.store import LogStore, open_store

__all__ = ["list_escalations", "request_retry", "resolve_escalation"]


def list_escalations(
    wal_path: str | LogStore, *, include_resolved: bool = False, decryptor: Any = None
) -> list[EscalationView]:
    """Return the escalations in the WAL, oldest first (open ones only by default).

    Args:
        wal_path: The write-ahead log.
        include_resolved: Also return escalations a human already resolved.
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).
    """
    # Open escalations survive forgetting the detail of ended sagas: memory then grows
    # with the open queue, not with the log (resolved ones are only kept for --all).
    fold, _ = fold_file(wal_path, decryptor, forget_terminal=not include_resolved)
    return fold.escalations() if include_resolved else fold.open_escalations()


def resolve_escalation(
    wal_path: str | LogStore,
    escalation: str,
    *,
    note: str,
    by: str | None = None,
    encryptor: Any = None,
) -> EscalationView:
    """Record that a human resolved ``escalation`` (durably, in the WAL).

    Args:
        wal_path: The write-ahead log.
        escalation: The escalation id (``esc-…``), as ``agent-saga escalations`` lists.
        note: What the human did or decided; required.
        by: Who resolved it (default: the current OS user).
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The escalation that was resolved.

    Raises:
        SagaUsageError: no such open escalation, or an empty note.
    """
    if not note or not note.strip():
        raise SagaUsageError("resolving an escalation needs a --note saying what was done")
    store = open_store(wal_path)
    open_ones = {e.escalation: e for e in list_escalations(store, decryptor=encryptor)}
    found = open_ones.get(escalation)
    if found is None:
        raise SagaUsageError(
            f"no open escalation {escalation!r} in {store.display}; list them with "
            "`agent-saga escalations`"
        )
    who = by or current_user()
    writer = store.writer(encryptor=encryptor)
    writer.append(
        {
            "type": R.ESCALATION_RESOLVED,
            "escalation": escalation,
            "note": redact(note),  # a human may paste a credential into a note
            "by": who,
            "ts": time.time(),
        }
    )
    return found


def request_retry(
    wal_path: str | LogStore,
    escalation: str,
    *,
    note: str,
    by: str | None = None,
    encryptor: Any = None,
) -> EscalationView:
    """Ask recovery to try an escalated step again, once its cause is fixed.

    The request is a durable ``escalation_retry`` record; the next pass of
    ``saga-recoveryd`` (run with the ``--import`` that was missing, say) claims it and
    undoes the step through the same path and the same recovery token as before, so
    the compensation still happens at most once. If it fails again, the escalation is
    open again with the new reason; if it succeeds, the daemon resolves it.

    Args:
        wal_path: The write-ahead log.
        escalation: The escalation id (``esc-…``).
        note: What was fixed; required.
        by: Who asks (default: the current OS user).
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The escalation the retry is for.

    Raises:
        SagaUsageError: no such open escalation, an empty note, an escalation of a
            whole saga (nothing to retry: resolve it), a saga still in progress, a
            step already compensated, or a retry already pending.
    """
    if not note or not note.strip():
        raise SagaUsageError("retrying an escalation needs a --note saying what was fixed")
    store = open_store(wal_path)
    fold, _ = fold_file(store, encryptor)  # the whole log, without holding the lock
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        fold.feed(x.read_from(fold.position))  # then only what was appended meanwhile
        found = {e.escalation: e for e in fold.open_escalations()}.get(escalation)
        if found is None:
            raise SagaUsageError(
                f"no open escalation {escalation!r} in {store.display}; list them with "
                "`agent-saga escalations`"
            )
        view = fold.get(found.saga_id)
        step = None if view is None or found.step is None else view.steps.get(found.step)
        problem = None
        if found.step is None or step is None:
            problem = "it is about the saga as a whole, not one step: check it and resolve it"
        elif view is not None and not view.terminal:
            problem = "its saga is still in progress; retry once it has ended"
        elif step.state == "compensated":
            problem = (
                "its step was already compensated (the escalation is about something else, "
                "such as an earlier attempt that may have landed): check it and resolve it"
            )
        elif found.retry is not None and found.retry.outcome is None:
            problem = "a retry is already pending; run saga-recoveryd to carry it out"
        if problem is not None:
            raise SagaUsageError(f"escalation {escalation} cannot be retried: {problem}")
        x.append_locked(
            [
                {
                    "type": R.ESCALATION_RETRY,
                    "escalation": escalation,
                    "saga": found.saga_id,
                    "step": found.step,
                    "note": redact(note),
                    "by": by or current_user(),
                    "ts": time.time(),
                }
            ]
        )
    return found
