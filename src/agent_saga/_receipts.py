"""Following a pending compensation until it is final (``docs/undo.md``, "Verified undo").

A compensation may answer with a :class:`~agent_saga.Receipt` that is ``pending``:
the service accepted the inverse but has not made it final (a refund in
``pending``). ``saga-recoveryd`` calls the receipt's ``follow`` handler on each pass
(:func:`follow_receipt`) until it answers a final receipt, then records
``compensation_verified``; one that did not verify is escalated, and the saga stays
*in doubt* until a person resolves it. A protocol generator (``_commands``), like
the undo of one step.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from ._commands import Append, Call, Command
from ._registry import get_handler
from ._types import Receipt
from ._undo import error_text, escalate, jsonable, revive_refs
from .errors import HandlerNotRegistered
from .secrets import redact
from .wal import records as R
from .wal.receipts import PendingReceipt

__all__ = ["FollowResult", "follow_receipt", "refuse_tampered"]

FollowResult = tuple[str, str | None]
"""``(outcome, detail)``: ``verified``, ``unverified`` (escalated), ``pending`` (still
not final), ``failed`` (the check raised: tried again next pass) or ``escalated``
(the receipt cannot be followed here)."""


def refuse_tampered(p: PendingReceipt, finding: str, by: str) -> Generator[Command, Any, None]:
    """Settle a pending compensation whose records fail verification: never followed.

    Its ``follow`` handler and kwargs come from records a checkpoint no longer
    vouches for, so nothing is called; it is recorded as not verified (it is not
    followed again) and escalated with the finding.
    """
    reason = f"not followed: its records fail verification ({finding})"
    yield Append(
        {
            "type": R.COMPENSATION_VERIFIED,
            "saga": p.saga_id,
            "step": p.step,
            "token": p.token,
            "verified": False,
            "receipt": {},
            "reason": reason,
            "by": by,
            "min_reader": 3,
            "ts": time.time(),
        }
    )
    yield from escalate(p.saga_id, p.step, f"pending compensation {reason}", by, doubt=True)


def follow_receipt(p: PendingReceipt, by: str) -> Generator[Command, Any, FollowResult]:
    """Check one pending compensation again; record it once it is final."""
    try:
        fn = get_handler(p.follow)
    except HandlerNotRegistered:
        reason = (
            f"the compensation of step {p.step} is pending and cannot be followed here: "
            f"handler {p.follow!r} is not registered in this saga-recoveryd (--import the "
            "module that registers it)"
        )
        yield from escalate(p.saga_id, p.step, reason, by, doubt=True)
        return "escalated", reason
    try:
        answer = yield Call(fn, (), revive_refs(dict(p.kwargs)))
    except Exception as exc:  # a network error: the refund is still what it was
        return "failed", error_text(exc)
    if not isinstance(answer, Receipt):
        reason = (
            f"follow handler {p.follow!r} returned {type(answer).__name__}, not a Receipt: "
            f"the compensation of step {p.step} stays in doubt"
        )
        yield from escalate(p.saga_id, p.step, reason, by, doubt=True)
        return "escalated", reason
    if answer.pending:
        return "pending", None
    record: dict[str, Any] = {
        "type": R.COMPENSATION_VERIFIED,
        "saga": p.saga_id,
        "step": p.step,
        "token": p.token,
        "verified": answer.verified is True,
        "receipt": redact(jsonable(dict(answer.detail))),
        "by": by,
        "min_reader": 3,
        "ts": time.time(),
    }
    if answer.verified is not True:
        why = answer.reason or "the service did not confirm it"
        record["reason"] = str(redact(why))[:500]
    yield Append(record)
    if answer.verified is True:
        return "verified", None
    reason = (
        f"the compensation of step {p.step} was accepted but did not complete: "
        f"{record['reason']}; the effect may still be in place"
    )
    yield from escalate(p.saga_id, p.step, reason, by, doubt=True)
    return "unverified", record["reason"]
