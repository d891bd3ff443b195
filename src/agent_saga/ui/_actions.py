"""State-changing API calls: the operator's input checked, an escalation resolved.

Resolving writes exactly what the CLI writes, through the same function
(:func:`agent_saga.recovery.escalations.resolve_escalation`). Deciding an approval
request (through :func:`agent_saga.approvals.decide_approval`) lives with the rest
of the approval queue in ``_approvals_api.py``; both use :func:`note_and_by`.

Neither drives a compensation, so neither is refused when the saga's records fail
verification against the log's checkpoints (``docs/audit.md``): resolving records a
person's note (what they did by hand is the way out of a tampered saga), and an
approval decides a live agent's forward step, whose kwargs the agent holds and the
request's digest binds. What compensates — the undo (``_undo_api.py``, through
``undo_saga``) — is refused; a retry is requested with ``agent-saga escalations
retry`` and carried out by ``saga-recoveryd``, which checks the records it re-reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..errors import SagaUsageError
from ..secrets import find_secrets, redact
from ._api import ApiError, _text
from ._index import WalIndex

__all__ = ["MAX_BY", "MAX_NOTE", "note_and_by", "resolve"]

MAX_NOTE: Final = 4000
MAX_BY: Final = 100


def note_and_by(
    body: Mapping[str, Any],
    default_by: str | None,
    *,
    field: str = "note",
    missing: str = "a note is required: say what was done or decided",
) -> tuple[str, str | None]:
    """The operator's text (``body[field]``) and name, checked; nothing secret passes.

    Shared by every state-changing call (resolve, decide, undo).

    Raises:
        ApiError: 400 without the text, when it or the name is too long or looks
            like a credential.
    """
    note = body.get(field)
    if not isinstance(note, str) or not note.strip():
        raise ApiError(400, missing)
    if len(note) > MAX_NOTE:
        raise ApiError(400, f"the {field} is limited to {MAX_NOTE} characters")
    by = body.get("by")
    if by is None or (isinstance(by, str) and not by.strip()):
        by = default_by
    if by is not None and (not isinstance(by, str) or len(by) > MAX_BY or not by.isprintable()):
        raise ApiError(400, f"'by' must be a printable name of at most {MAX_BY} characters")
    for text, what in ((note, field), (by or "", "name")):
        found = find_secrets(text)
        if found:
            raise ApiError(
                400,
                f"the {what} looks like it contains a credential ({found[0].kind}); "
                "the log must never hold one: describe it instead",
            )
    return note, None if by is None else by.strip()


def _note_and_by(body: Mapping[str, Any], default_by: str) -> tuple[str, str]:
    note, by = note_and_by(body, default_by)
    assert by is not None
    return note, by


def resolve(
    index: WalIndex, escalation: str, body: Mapping[str, Any], *, default_by: str, encryptor: Any
) -> dict[str, Any]:
    """``POST /api/v1/escalations/<id>/resolve`` ``{"note", "by"?}``.

    Writes exactly what ``agent-saga escalations resolve ID --note N [--by B]`` writes
    (:func:`agent_saga.recovery.escalations.resolve_escalation`).

    Raises:
        ApiError: 400 without a note; 409 when the escalation is not open.
    """
    from ..recovery.escalations import resolve_escalation

    note, by = _note_and_by(body, default_by)
    try:
        e = resolve_escalation(index.store, escalation, note=note, by=by, encryptor=encryptor)
    except SagaUsageError as exc:
        raise ApiError(409, str(redact(str(exc)))) from exc
    index.refresh()
    return {"resolved": e.escalation, "saga": _text(e.saga_id), "step": e.step, "by": by}
