"""One approval request's story (``docs/log-format.md`` §12.3), as a JSON document.

What ``agent-saga approvals --json`` prints for each request, and what the debugger
UI shows (``/api/v1/approvals``, ``story``): the fold's
:class:`~agent_saga.wal.views.ApprovalView` (every decision with who, when,
break-glass, note and whether it counted, and the attempts that ran under it), a
one-line ``state`` and what was ``asked``. Reading only: nothing here writes.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .wal import records as R
from .wal.views import ApprovalView

__all__ = ["approval_state", "approval_story"]


def approval_state(a: ApprovalView, now: float) -> str:
    """The request's state in one line: ``approved by alice+bob``, ``open (1 of 2 approved)``.

    Args:
        a: The request.
        now: Wall-clock seconds (an undecided request past its expiry is ``expired``).

    Returns:
        ``<decision> by <who>``, ``saga ended``, ``expired``, ``open`` or
        ``open (N of Q approved)``.
    """
    if a.decided:
        return f"{a.decision} by {a.decided_by}"
    if a.saga_ended:
        return "saga ended"
    if a.expired(now):
        return "expired"
    return "open" if a.quorum == 1 else f"open ({len(a.approvers)} of {a.quorum} approved)"


def approval_story(a: ApprovalView, now: float) -> dict[str, Any]:
    """One request's story: the view's fields, ``state`` and ``asked``.

    Args:
        a: The request.
        now: Wall-clock seconds, for :func:`approval_state`.

    Returns:
        A JSON-ready document (``json.dumps(..., default=str)``).
    """
    doc = asdict(a)
    doc["state"] = approval_state(a, now)
    doc["asked"] = {
        "ts": a.ts,
        "by": a.requested_by,
        "agent": a.agent,
        "saga": a.saga_id,
        "name": a.saga_name,
        "step": a.step,
        "tool": a.tool,
        "digest": a.digest,
        # What ``approvals standing add --digest`` takes to approve this call ahead of time.
        "args_digest": R.args_digest(a.tool, a.kwargs),
        "quorum": a.quorum,
        "ttl": a.ttl,
        "expires": a.expires,
    }
    return doc
