"""The human queue: list open escalations and record a human's decision.

Memory follows the queue, not the log: a listing folds only the queue's records
(``escalated``, ``escalation_resolved``, ``escalation_retry``, a retry's ``claim``)
and keeps an escalation only while it is open (``--all``: every escalation, what it
prints). Deciding on one escalation folds only that escalation's records, and, for a
retry, that saga's. Each is one pass over the log (a retry two: the saga is known
only once its escalation was found); without an index, a pass is the least that can
prove no later record resolved or retried it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import SagaUsageError
from ..gate import human_identity
from ..secrets import redact
from ..wal import records as R
from ..wal.state import EscalationView, SagaFold
from ..wal.store import LogStore, open_store

__all__ = ["fold_escalations", "list_escalations", "request_retry", "resolve_escalation"]

_QUEUE: Final = frozenset({R.ESCALATED, R.ESCALATION_RESOLVED, R.ESCALATION_RETRY})


def _queue_record(data: Mapping[str, Any]) -> bool:
    rtype = data.get("type")
    return rtype in _QUEUE or (rtype == R.CLAIM and "retry" in data)


def _of_escalation(escalation: str) -> Callable[[Mapping[str, Any]], bool]:
    """The records that decide one escalation's state (its own, its retries' claims)."""

    def only(data: Mapping[str, Any]) -> bool:
        if data.get("escalation") == escalation:
            return True
        return data.get("type") == R.CLAIM and data.get("retry") == escalation

    return only


def fold_escalations(
    wal_path: str | LogStore, *, include_resolved: bool = False, decryptor: Any = None
) -> SagaFold:
    """Fold the human queue of a WAL (no saga detail: only the queue's records).

    Args:
        wal_path: The write-ahead log.
        include_resolved: Keep resolved escalations too (else only open ones are kept).
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The fold: ``escalations()`` / ``open_escalations()``, and ``damages``.

    Raises:
        WALKeyMissing: the log is encrypted and no key is configured.
        WALAuthenticationFailed: a record failed authentication.
    """
    fold = SagaFold(forget_terminal=True, remember_ended=False, keep_resolved=include_resolved)
    fold.feed(open_store(wal_path).scan(decryptor=decryptor), only=_queue_record)
    return fold


def list_escalations(
    wal_path: str | LogStore, *, include_resolved: bool = False, decryptor: Any = None
) -> list[EscalationView]:
    """Return the escalations in the WAL, oldest first (open ones only by default).

    Args:
        wal_path: The write-ahead log.
        include_resolved: Also return escalations a human already resolved.
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The escalations.

    Raises:
        WALKeyMissing: the log is encrypted and no key is configured.
        WALAuthenticationFailed: a record failed authentication.
    """
    fold = fold_escalations(wal_path, include_resolved=include_resolved, decryptor=decryptor)
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
    fold = SagaFold(forget_terminal=True, remember_ended=False)
    fold.feed(store.scan(decryptor=encryptor), only=_of_escalation(escalation))
    found = next((e for e in fold.open_escalations() if e.escalation == escalation), None)
    if found is None:
        raise SagaUsageError(
            f"no open escalation {escalation!r} in {store.display}; list them with "
            "`agent-saga escalations`"
        )
    who = human_identity(by)
    writer = store.writer(encryptor=encryptor)
    writer.append(
        {
            "type": R.ESCALATION_RESOLVED,
            "escalation": escalation,
            "note": redact(note),  # a human may paste a credential into a note
            "by": who["name"],
            "identity": who,
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
    who = human_identity(by)
    store = open_store(wal_path)
    # Pass 1: the escalation alone, to learn its saga (and fail fast if it is not open).
    queue = SagaFold(forget_terminal=True, remember_ended=False)
    queue.feed(store.scan(decryptor=encryptor), only=_of_escalation(escalation))
    first = next((e for e in queue.open_escalations() if e.escalation == escalation), None)
    if first is None:
        raise SagaUsageError(
            f"no open escalation {escalation!r} in {store.display}; list them with "
            "`agent-saga escalations`"
        )
    # Pass 2: that saga's records and the escalation's, as the full fold would see them.
    saga_id, of_escalation = first.saga_id, _of_escalation(escalation)

    undone = False

    def only(data: Mapping[str, Any]) -> bool:
        nonlocal undone
        if data.get("saga") == saga_id and data.get("type") == R.UNDO_REQUESTED:
            undone = True
        return data.get("saga") == saga_id or of_escalation(data)

    fold = SagaFold()
    fold.feed(store.scan(decryptor=encryptor), only=only)  # without holding the lock
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        fold.feed(x.read_from(fold.position), only=only)  # then what was appended meanwhile
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
        elif undone:
            problem = (
                "its saga was undone after it committed (agent-saga undo), and this "
                "escalation may come from that undo, whose compensations use undo tokens: a "
                "retry with the recovery token could compensate twice. Run the undo again "
                "(agent-saga undo) or resolve it by hand"
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
                    "by": who["name"],
                    "identity": who,
                    "ts": time.time(),
                }
            ]
        )
    return found
