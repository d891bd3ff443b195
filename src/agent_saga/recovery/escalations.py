"""The human queue: list open escalations and record a human's decision."""

from __future__ import annotations

import time
from typing import Any

from ..errors import SagaUsageError
from ..gate import current_user
from ..secrets import redact
from ..wal import records as R
from ..wal.state import EscalationView, fold_file
from ..wal.writer import open_writer

__all__ = ["list_escalations", "resolve_escalation"]


def list_escalations(
    wal_path: str, *, include_resolved: bool = False, decryptor: Any = None
) -> list[EscalationView]:
    """Return the escalations in the WAL, oldest first (open ones only by default).

    Args:
        wal_path: The write-ahead log.
        include_resolved: Also return escalations a human already resolved.
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).
    """
    fold, _ = fold_file(wal_path, decryptor)
    return fold.escalations() if include_resolved else fold.open_escalations()


def resolve_escalation(
    wal_path: str, escalation: str, *, note: str, by: str | None = None, encryptor: Any = None
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
    open_ones = {e.escalation: e for e in list_escalations(wal_path, decryptor=encryptor)}
    found = open_ones.get(escalation)
    if found is None:
        raise SagaUsageError(
            f"no open escalation {escalation!r} in {wal_path}; list them with "
            "`agent-saga escalations`"
        )
    who = by or current_user()
    writer = open_writer(wal_path, encryptor=encryptor)
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
