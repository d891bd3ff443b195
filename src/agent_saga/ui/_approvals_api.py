"""The approval queue in the debugger: ``GET /api/v1/approvals`` and its decisions.

Each request carries its whole story (``docs/log-format.md`` §12.3): quorum progress,
every decision (who, when, break-glass, note, whether it counted and why not), the
expiry, and the attempts that ran under it. ``story`` is exactly what
``agent-saga approvals --json`` prints for the request
(:func:`agent_saga._approvals_story.approval_story`), redacted and bounded like
every value from the log. ``POST /api/v1/approvals/<id>/decide`` goes through
:func:`agent_saga.approvals.decide_approval`, the function the CLI calls, so the
same rules refuse the same decisions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .._approvals_story import approval_story
from ..errors import SagaUsageError
from ..secrets import redact
from ..wal.views import ApprovalView
from ._actions import note_and_by
from ._api import ApiError, _bounded, _text
from ._index import WalIndex

__all__ = ["approvals", "decide", "progress"]


def _state(a: ApprovalView, now: float) -> str:
    """``open``, ``approved``, ``denied``, ``expired`` or ``saga_ended`` (one word)."""
    if a.decided:
        return str(a.decision)
    if a.saga_ended:
        return "saga_ended"
    return "expired" if a.expired(now) else "open"


def progress(a: ApprovalView) -> str:
    """Quorum progress in words: ``1 of 2 approvals``."""
    return f"{len(a.approvers)} of {a.quorum} approval{'' if a.quorum == 1 else 's'}"


def _item(a: ApprovalView, now: float) -> dict[str, Any]:
    return {
        "request": a.request,
        "saga": _text(a.saga_id),
        "saga_name": _text(a.saga_name),
        "step": a.step,
        "tool": _text(a.tool),
        "semantics": a.semantics,
        "kwargs": _bounded(a.kwargs),
        "expires": a.expires,
        "requested_by": _text(a.requested_by),
        "ts": a.ts,
        "state": _state(a, now),
        "decision": a.decision,
        "decided_by": _text(a.decided_by),
        "note": _text(a.note),
        "decided_ts": a.decided_ts,
        "quorum": a.quorum,
        "approvers": _text(list(a.approvers)),
        "progress": progress(a),
        "break_glass": a.break_glass,
        "story": _bounded(approval_story(a, now)),
    }


def approvals(index: WalIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /api/v1/approvals[?all=1]``: approval requests, oldest first.

    Args:
        index: The WAL index.
        params: ``all=1`` also lists decided and expired requests of live sagas.

    Returns:
        ``{"items": [...], "open": n}``; each item's ``story`` is what
        ``agent-saga approvals --json`` prints for it.
    """
    every = params.get("all") in ("1", "true")
    now = time.time()
    out = []
    n_open = 0
    for a in index.approvals():
        item = _item(a, now)
        n_open += item["state"] == "open"
        if every or item["state"] == "open":
            out.append(item)
    return {"items": out, "open": n_open}


def decide(
    index: WalIndex, request: str, body: Mapping[str, Any], *, default_by: str, encryptor: Any
) -> dict[str, Any]:
    """``POST /api/v1/approvals/<id>/decide``.

    Body: ``{"decision": "approve"|"deny", "note", "by"?, "break_glass"?}``. Writes
    exactly what ``agent-saga approvals approve|deny ID --note N [--as B]
    [--break-glass]`` writes (:func:`agent_saga.approvals.decide_approval`): a
    quorum request stays open until enough different people approved.

    Returns:
        ``{"request", "decision", "state", "saga", "step", "tool", "by", "quorum",
        "approvers", "progress", "break_glass", "message"}`` (``decision`` is None
        while a quorum waits; ``message`` is the CLI's line).

    Raises:
        ApiError: 400 for a bad decision, no note or a non-boolean ``break_glass``;
            409 with :class:`~agent_saga.errors.ApprovalDecisionRefused`'s line when
            the request is unknown, settled, expired, its saga ended, or this person
            already decided it (nothing written, except an expiry noticed first).
    """
    from ..approvals import decide_approval

    decision = body.get("decision")
    if decision not in ("approve", "deny"):
        raise ApiError(400, "decision must be 'approve' or 'deny'")
    glass = body.get("break_glass", False)
    if not isinstance(glass, bool):
        raise ApiError(400, "break_glass must be true or false")
    note, by = note_and_by(body, default_by)
    by = by or default_by
    try:
        a = decide_approval(
            index.store,
            request,
            approve=decision == "approve",
            note=note,
            by=by,
            encryptor=encryptor,
            break_glass=glass,
        )
    except SagaUsageError as exc:
        raise ApiError(409, str(redact(str(exc))).splitlines()[0]) from exc
    index.refresh()
    what = a.decision if a.decided else f"approval {len(a.approvers)} of {a.quorum} of"
    who = a.decided_by if a.decided else a.approvers[-1]
    message = f"{what} {a.request} (saga {a.saga_id}, step {a.step}, tool {a.tool}) by {who}" + (
        " (break-glass)" if glass else ""
    )
    return {
        "request": a.request,
        "decision": a.decision,
        "state": _state(a, time.time()),
        "saga": _text(a.saga_id),
        "step": a.step,
        "tool": _text(a.tool),
        "by": by,
        "quorum": a.quorum,
        "approvers": _text(list(a.approvers)),
        "progress": progress(a),
        "break_glass": glass,
        "message": _text(message),
    }
