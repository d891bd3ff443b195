"""``agent-saga escalations`` and ``agent-saga approvals``: the two human queues.

Each lists its queue from the log, or records one human decision in it:
``escalations resolve|retry`` and ``approvals approve|deny [--break-glass]``;
``approvals standing add|revoke|list`` manages standing approvals (§12.3).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TextIO

from ._approvals_story import approval_state, approval_story
from ._cli_common import open_wal, print_table, report_damage, timestamp
from ._cli_support import EXIT_OK
from .errors import SagaUsageError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .wal.state import ApprovalView

__all__ = ["add_standing_commands", "cmd_approvals", "cmd_escalations", "parse_expires"]


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


def cmd_approvals(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga approvals``: list approval requests, or approve / deny one."""
    from .approvals import decide_approval, fold_approvals

    action = getattr(args, "apr_command", None)
    if action in ("approve", "deny"):
        a = decide_approval(
            open_wal(args),
            args.id,
            approve=action == "approve",
            note=args.note,
            by=args.by,
            break_glass=args.break_glass,
        )
        what = a.decision if a.decided else f"approval {len(a.approvers)} of {a.quorum} of"
        glass = " (break-glass)" if args.break_glass else ""
        out.write(
            f"{what} {a.request} (saga {a.saga_id}, step {a.step}, tool {a.tool}) "
            f"by {a.decided_by if a.decided else a.approvers[-1]}{glass}\n"
        )
        return EXIT_OK
    if action == "standing":
        return _cmd_standing(args, out, err)
    # The queue's records and saga begin/end only; a request is kept while its saga
    # has not ended (--all, --break-glass: every request).
    every = args.all or args.list_break_glass
    fold = fold_approvals(open_wal(args), include_closed=every)
    now = time.time()
    items = fold.approvals() if every else fold.open_approvals(now=now)
    code = report_damage(fold.damages, err, "the approval queue above")
    if args.list_break_glass:
        return _break_glass(items, args.json, out, code)
    if args.json:
        json.dump([approval_story(a, now) for a in items], out, indent=2, default=str)
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
                approval_state(a, now),
            ]
        )
    print_table(rows, out)
    return code


def _break_glass(items: list[ApprovalView], as_json: bool, out: TextIO, code: int) -> int:
    """``approvals --break-glass``: every break-glass decision, oldest first, for review."""
    found = [
        {
            "request": a.request,
            "saga": a.saga_id,
            "step": a.step,
            "tool": a.tool,
            "digest": a.digest,
            **{k: d[k] for k in ("decision", "by", "identity", "ts", "note", "counted")},
            "used_by": a.used_by,
        }
        for a in items
        for d in a.decisions
        if d["break_glass"]
    ]
    if as_json:
        json.dump(found, out, indent=2, default=str)
        out.write("\n")
        return code
    if not found:
        out.write("no break-glass decisions\n")
        return code
    rows = [["REQUEST", "SAGA", "STEP", "TOOL", "DECISION", "BY", "WHEN", "NOTE"]]
    for f in found:
        rows.append(
            [
                str(f["request"]),
                str(f["saga"]),
                str(f["step"]),
                str(f["tool"]),
                str(f["decision"]),
                str(f["by"]),
                timestamp(f["ts"]),
                str(f["note"]),
            ]
        )
    print_table(rows, out)
    return code


# ---- standing approvals -----------------------------------------------------------------

_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_expires(text: str, now: float) -> float:
    """``--expires``: a duration from now (``90s``, ``30m``, ``24h``, ``7d``) or an
    ISO-8601 time (``2027-01-31T18:00:00Z``; without a zone, UTC).

    Raises:
        SagaUsageError: neither.
    """
    value = text.strip()
    if value and value[-1] in _UNITS:
        with contextlib.suppress(ValueError):
            amount = float(value[:-1])
            if amount > 0:
                return now + amount * _UNITS[value[-1]]
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SagaUsageError(
            f"--expires {text!r}: give a duration (30m, 24h, 7d) or an ISO time "
            "(2027-01-31T18:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def add_standing_commands(
    apr_sub: Any, add_wal_path: Callable[[argparse.ArgumentParser, str], None]
) -> None:
    """``approvals standing add|revoke|list``."""
    standing = apr_sub.add_parser(
        "standing",
        help="standing approvals: a tool with exactly these arguments, or up to an amount",
        description="Approve calls in scope ahead of time, until the approval expires or is "
        "revoked; an ApprovalQueue then uses it instead of asking.",
    )
    std_sub = standing.add_subparsers(dest="std_command", metavar="ACTION", required=True)
    add = std_sub.add_parser("add", help="record a standing approval")
    add.add_argument("--tool", required=True, help="the tool it approves")
    add.add_argument("--digest", default=None, help="exactly the call of this args digest")
    add.add_argument("--kwargs", default=None, help="exactly these arguments (a JSON object)")
    add.add_argument("--arg", default=None, help="a number argument (with --max)")
    add.add_argument("--max", dest="max_value", type=float, default=None, help="its largest value")
    add.add_argument("--expires", required=True, help="30m, 24h, 7d, or an ISO time")
    add.add_argument("--note", required=True, help="why; recorded")
    add.add_argument("--as", "--by", dest="by", default=None, metavar="NAME", help="who grants it")
    add.add_argument(
        "--quorum",
        type=int,
        default=1,
        help="how many different people must grant it (you are the first; the others run "
        "`standing approve`); a queue uses it only if this is at least its own quorum",
    )
    add.add_argument("--json", action="store_true", help="print the record as JSON")
    add_wal_path(add, "action_wal_path")
    grant = std_sub.add_parser("approve", help="grant a standing approval as one more person")
    grant.add_argument("id", help="the standing approval's id (std-...)")
    grant.add_argument("--note", required=True, help="why; recorded")
    grant.add_argument("--as", "--by", dest="by", default=None, metavar="NAME", help="who")
    add_wal_path(grant, "action_wal_path")
    revoke = std_sub.add_parser("revoke", help="revoke a standing approval")
    revoke.add_argument("id", help="the standing approval's id (std-...)")
    revoke.add_argument("--note", default="", help="why; recorded")
    revoke.add_argument("--as", "--by", dest="by", default=None, metavar="NAME", help="who")
    add_wal_path(revoke, "action_wal_path")
    listing = std_sub.add_parser("list", help="list standing approvals and their uses")
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    add_wal_path(listing, "action_wal_path")


def _cmd_standing(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .approvals import add_standing, approve_standing, fold_approvals, revoke_standing

    if args.std_command == "add":
        kwargs = None
        if args.kwargs is not None:
            try:
                kwargs = json.loads(args.kwargs)
            except ValueError:
                kwargs = None
            if not isinstance(kwargs, dict):
                raise SagaUsageError("--kwargs must be a JSON object")
        view = add_standing(
            _log_to_write(args),  # a standing approval may come before any saga
            args.tool,
            expires=parse_expires(args.expires, time.time()),
            note=args.note,
            digest=args.digest,
            kwargs=kwargs,
            arg=args.arg,
            max_value=args.max_value,
            by=args.by,
            quorum=args.quorum,
        )
        if args.json:
            json.dump(asdict(view), out, indent=2, default=str)
            out.write("\n")
        else:
            waiting = "" if view.granted else f" (waiting: {_granted(view)})"
            out.write(
                f"standing approval {view.standing}: {view.tool} {_scope(view.scope)} "
                f"until {timestamp(view.expires)} by {view.by}{waiting}\n"
            )
        return EXIT_OK
    if args.std_command == "approve":
        view = approve_standing(open_wal(args), args.id, note=args.note, by=args.by)
        state = "in force" if view.granted else f"waiting: {_granted(view)}"
        out.write(
            f"granted standing approval {view.standing} ({view.tool}) as "
            f"{view.approvers[-1]}: {state}\n"
        )
        return EXIT_OK
    if args.std_command == "revoke":
        view = revoke_standing(open_wal(args), args.id, note=args.note, by=args.by)
        out.write(f"revoked standing approval {view.standing} ({view.tool})\n")
        return EXIT_OK
    fold = fold_approvals(open_wal(args), include_closed=True)
    items = fold.standing_approvals()
    code = report_damage(fold.damages, err, "the standing approvals above")
    now = time.time()
    if args.json:
        json.dump(
            [{**asdict(v), "in_force": v.in_force(now)} for v in items],
            out,
            indent=2,
            default=str,
        )
        out.write("\n")
        return code
    if not items:
        out.write("no standing approvals\n")
        return code
    rows = [["STANDING", "TOOL", "SCOPE", "EXPIRES", "BY", "USES", "STATE", "NOTE"]]
    for v in items:
        state = "in force" if v.in_force(now) else "expired"
        if not v.granted and v.expires > now:
            state = f"waiting: {_granted(v)}"
        if v.revoked is not None:
            state = f"revoked by {v.revoked['by']}"
        rows.append(
            [
                v.standing,
                v.tool,
                _scope(v.scope),
                timestamp(v.expires),
                str(v.by),
                str(len(v.used_by)),
                state,
                str(v.note),
            ]
        )
    print_table(rows, out)
    return code


def _granted(v: Any) -> str:
    """``1 of 2 granted (alice)``: a standing approval's quorum so far."""
    return f"{len(v.approvers)} of {v.quorum} granted ({', '.join(v.approvers)})"


def _log_to_write(args: argparse.Namespace) -> Any:
    """The log ``standing add`` writes to: like ``open_wal``, but it may not exist yet."""
    from . import _config
    from .wal.store import open_store

    inner: str | None = getattr(args, "action_wal_path", None)
    if args.wal_path is not None and inner is not None and args.wal_path != inner:
        raise SagaUsageError(f"two different --wal-path values: {args.wal_path} and {inner}")
    chosen = inner if inner is not None else args.wal_path
    return open_store(str(_config.default_wal_path() if chosen is None else chosen))


def _scope(scope: dict[str, Any]) -> str:
    if "digest" in scope:
        return f"digest {scope['digest']}"
    return f"{scope.get('arg')} <= {scope.get('max')}"
