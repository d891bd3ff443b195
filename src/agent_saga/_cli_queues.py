"""``agent-saga escalations`` and ``agent-saga approvals``: the two human queues.

Each lists its queue from the log, or records one human decision in it:
``escalations resolve|retry`` and ``approvals approve|deny``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, TextIO

from ._cli_common import open_wal, print_table, report_damage, timestamp
from ._cli_support import EXIT_OK

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .wal.state import ApprovalView

__all__ = ["cmd_approvals", "cmd_escalations"]


def cmd_escalations(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga escalations``: list the human queue, or resolve / retry one item."""
    from .recovery.escalations import fold_escalations, request_retry, resolve_escalation

    if getattr(args, "esc_command", None) == "resolve":
        found = resolve_escalation(open_wal(args), args.id, note=args.note, by=args.by)
        out.write(f"resolved {found.escalation} (saga {found.saga_id}, step {found.step})\n")
        return EXIT_OK
    if getattr(args, "esc_command", None) == "retry":
        found = request_retry(open_wal(args), args.id, note=args.note, by=args.by)
        out.write(
            f"retry of {found.escalation} requested (saga {found.saga_id}, step {found.step}); "
            "the next `saga-recoveryd --once` (with the --import your handlers need) "
            "retries it with the same recovery token\n"
        )
        return EXIT_OK
    # The queue's records only; an escalation is kept while open (--all: all of them).
    fold = fold_escalations(open_wal(args), include_resolved=args.all)
    items = fold.escalations() if args.all else fold.open_escalations()
    code = report_damage(fold.damages, err, "the human queue above")
    if args.json:
        json.dump([asdict(e) for e in items], out, indent=2, default=str)
        out.write("\n")
        return code
    if not items:
        out.write("no open escalations\n" if not args.all else "no escalations\n")
        return code
    rows = [["ESCALATION", "SAGA", "STEP", "RAISED", "STATE", "REASON"]]
    for e in items:
        state = f"resolved by {e.resolved_by}" if e.resolved else "open"
        step = "-" if e.step is None else str(e.step)
        rows.append([e.escalation, e.saga_id, step, timestamp(e.ts), state, e.reason])
    print_table(rows, out)
    return code


def _approval_state(a: ApprovalView, now: float) -> str:
    if a.decided:
        return f"{a.decision} by {a.decided_by}"
    if a.saga_ended:
        return "saga ended"
    return "expired" if a.expired(now) else "open"


def cmd_approvals(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga approvals``: list approval requests, or approve / deny one."""
    from .approvals import decide_approval, fold_approvals

    action = getattr(args, "apr_command", None)
    if action in ("approve", "deny"):
        a = decide_approval(
            open_wal(args), args.id, approve=action == "approve", note=args.note, by=args.by
        )
        out.write(
            f"{a.decision} {a.request} (saga {a.saga_id}, step {a.step}, tool {a.tool}) "
            f"by {a.decided_by}\n"
        )
        return EXIT_OK
    # The queue's records and saga begin/end only; a request is kept while its saga
    # has not ended (--all: every request, what it prints).
    fold = fold_approvals(open_wal(args), include_closed=args.all)
    now = time.time()
    items = fold.approvals() if args.all else fold.open_approvals(now=now)
    code = report_damage(fold.damages, err, "the approval queue above")
    if args.json:
        data = [{**asdict(a), "state": _approval_state(a, now)} for a in items]
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return code
    if not items:
        out.write("no open approval requests\n" if not args.all else "no approval requests\n")
        return code
    rows = [["REQUEST", "SAGA", "STEP", "TOOL", "KWARGS", "REQUESTED", "EXPIRES", "STATE"]]
    for a in items:
        kwargs = json.dumps(a.kwargs, sort_keys=True, separators=(",", ":"), default=str)
        rows.append(
            [
                a.request,
                a.saga_id,
                str(a.step),
                a.tool,
                kwargs,
                timestamp(a.ts),
                timestamp(a.expires),
                _approval_state(a, now),
            ]
        )
    print_table(rows, out)
    return code
