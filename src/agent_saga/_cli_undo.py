"""``agent-saga undo``: undo a committed saga, or print the plan (``--dry-run``).

What it does is :func:`agent_saga.undo_saga` (docs/undo.md); this module holds its
flags and its output. Exit codes: 0 undone (or the plan printed), 1 the undo ended
escalated (a step could not be undone: `agent-saga escalations` lists it), 2 a bad
request (one line, nothing written).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TextIO

from ._cli_common import open_wal
from ._cli_support import EXIT_OK, EXIT_USAGE, positive_seconds
from .errors import SagaUsageError

__all__ = ["add_undo_command", "cmd_undo"]

EXIT_ESCALATED = 1


def add_undo_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_wal_path: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``undo`` to the ``agent-saga`` parser."""
    undo = sub.add_parser(
        "undo",
        help="undo a committed saga's steps, newest first, exactly once (--dry-run: the plan)",
        description="Undo a saga that already committed: compensate its steps (all, or "
        "--from-step N and later) newest first, through the same handlers saga-recoveryd "
        "uses, with undo tokens of their own. Recorded: who, why, which steps. "
        "Reference: docs/undo.md.",
    )
    undo.add_argument("saga", metavar="SAGA_ID", help="the committed saga to undo")
    add_wal_path(undo)
    # Checked by undo_saga, so that a missing reason is one line (exit 2).
    undo.add_argument("--reason", default=None, help="why (recorded); required")
    undo.add_argument(
        "--from-step", type=int, default=None, metavar="N", help="undo step N and later only"
    )
    undo.add_argument("--dry-run", action="store_true", help="print the exact plan; change nothing")
    undo.add_argument("--json", action="store_true", help="print one JSON document")
    undo.add_argument(
        "--as", dest="as_name", default=None, metavar="NAME", help="who asks (default: OS user)"
    )
    undo.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers the compensation handlers); repeatable",
    )
    undo.add_argument(
        "--plan",
        dest="expect_plan",
        default=None,
        metavar="SHA256",
        help="undo only if the plan is still this one (the digest a --dry-run printed)",
    )
    undo.add_argument(
        "--claim-seconds",
        type=positive_seconds,
        default=60.0,
        metavar="N",
        help="if this process dies, saga-recoveryd may finish the undo after N s (default 60)",
    )
    undo.set_defaults(handler=cmd_undo)


def cmd_undo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga undo SAGA_ID``: undo a committed saga, or print its plan."""
    from ._undo_saga import undo_saga

    if args.reason is None or not args.reason.strip():
        raise SagaUsageError("undo needs --reason TEXT saying why (it is recorded)")
    store = open_wal(args)
    if args.imports:  # handlers, and the undo's gate (govern_undo): a dry run says it
        from .recovery.cli import _import_modules

        problem = _import_modules(args.imports)
        if problem is not None:
            err.write(problem.replace("saga-recoveryd:", "agent-saga:", 1) + "\n")
            return EXIT_USAGE
    plan = undo_saga(
        args.saga,
        wal_path=store,
        reason=args.reason,
        by=args.as_name,
        dry_run=args.dry_run,
        from_step=args.from_step,
        claim_seconds=args.claim_seconds,
        expect_plan=args.expect_plan,
    )
    code = EXIT_OK if plan.dry_run or plan.outcome == "undone" else EXIT_ESCALATED
    if args.json:
        json.dump(plan.as_json(), out, indent=2, sort_keys=True)
        out.write("\n")
        return code
    what = "all steps" if plan.from_step is None else f"steps {plan.from_step} and later"
    head = "undo plan" if plan.dry_run else "undo"
    out.write(
        f"{head} of saga {plan.saga_id} ({plan.name or '-'}), {what}: {plan.undo}, asked by "
        f"{plan.by}: {plan.reason}\n"
    )
    for s in plan.steps:
        where = "-" if s.step is None else str(s.step)
        if s.action == "cannot_undo":
            line = f"  step {where:>3}  {s.tool or '-'}  cannot be undone: {s.why}"
        else:
            kwargs = json.dumps(dict(s.kwargs), sort_keys=True, separators=(",", ":"))
            verb = "compensate with" if s.action == "compensate" else "resolve, then compensate:"
            line = (
                f"  step {where:>3}  {s.tool or '-'}  {verb} {s.handler} {kwargs}  token {s.token}"
            )
        if not plan.dry_run and s.step is not None and s.step in plan.results:
            line += f"  -> {plan.results[s.step]}"
        out.write(line + "\n")
        if s.check is not None and s.action != "cannot_undo":
            out.write(f"             checks first: {s.check}\n")
    out.write(f"plan sha256 {plan.digest}\n")
    if plan.tampered is not None:
        out.write(
            f"refused: the log fails verification where this saga's records are "
            f"({plan.tampered}); an undo is refused: check it with `agent-saga wal verify`\n"
        )
    if plan.gate is not None:
        out.write(f"gate: {plan.gate}\n")
    if plan.dry_run:
        out.write("dry run: nothing was written and nothing called\n")
    elif plan.outcome is None:
        out.write("another process took this undo over; saga-recoveryd finishes it\n")
        code = EXIT_ESCALATED
    elif plan.outcome == "undone":
        out.write(f"undone: saga {plan.saga_id}\n")
    else:
        out.write("escalated: a step could not be undone; see `agent-saga escalations`\n")
    return code
