"""``agent-saga halt`` and ``agent-saga resume``: the kill switch (docs/governance.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO

from ._cli_common import open_wal, print_table, timestamp
from ._cli_support import EXIT_OK
from .wal.halts import halt, halts_in_force, resume

__all__ = ["add_halt_commands", "cmd_halt", "cmd_resume"]


def add_halt_commands(sub: Any, add_wal_path: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``agent-saga halt`` and ``agent-saga resume``."""
    h = sub.add_parser(
        "halt",
        help="kill switch: every gate on the log refuses new side effects in a scope",
        description="Record a halt: within about a second every gate sharing the log refuses "
        "new COMPENSABLE and IRREVERSIBLE steps in its scope (REVERSIBLE steps keep running); "
        "saga-recoveryd keeps recovering. --status lists the halts in force.",
    )
    add_wal_path(h)
    h.add_argument("--reason", help="why (required to halt; shown in every refusal)")
    h.add_argument(
        "--unwind",
        action="store_true",
        help="also roll back each saga in scope at its next step, even if its code goes on",
    )
    scope = h.add_mutually_exclusive_group()
    scope.add_argument("--tool", help="halt only this tool")
    scope.add_argument("--saga-name", help="halt only sagas of this name")
    scope.add_argument("--host", help="halt only the agents of this host")
    h.add_argument("--as", dest="by", metavar="NAME", help="who halts (default: the OS user)")
    h.add_argument("--status", action="store_true", help="list the halts in force; change nothing")
    h.add_argument("--json", action="store_true", help="print one JSON document")
    h.set_defaults(handler=cmd_halt)

    r = sub.add_parser(
        "resume",
        help="lift a halt (or every halt in force)",
        description="Record a resume: end the halt --halt ID, or every halt in force.",
    )
    add_wal_path(r)
    r.add_argument("--reason", required=True, help="why (recorded)")
    r.add_argument("--halt", dest="halt_id", metavar="ID", help="the halt to lift (hlt-...)")
    r.add_argument("--as", dest="by", metavar="NAME", help="who resumes (default: the OS user)")
    r.add_argument("--json", action="store_true", help="print one JSON document")
    r.set_defaults(handler=cmd_resume)


def cmd_halt(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga halt``: record a halt, or list those in force."""
    if args.status:
        in_force = halts_in_force(open_wal(args))
        if args.json:
            json.dump([h.as_json() for h in in_force], out, indent=2)
            out.write("\n")
        elif not in_force:
            out.write("no halt in force\n")
        else:
            rows = [["HALT", "SCOPE", "SINCE", "BY", "UNWIND", "REASON"]]
            for h in in_force:
                rows.append(
                    [
                        h.halt,
                        h.describe(),
                        timestamp(h.ts),
                        h.by,
                        "yes" if h.unwind else "no",
                        h.reason,
                    ]
                )
            print_table(rows, out)
        return EXIT_OK
    made = halt(
        open_wal(args),
        reason=args.reason,
        by=args.by,
        tool=args.tool,
        saga_name=args.saga_name,
        host=args.host,
        unwind=args.unwind,
    )
    if args.json:
        json.dump(made.as_json(), out, indent=2)
        out.write("\n")
    else:
        unwind = "; sagas in scope roll back at their next step" if made.unwind else ""
        out.write(
            f"halted {made.describe()}: {made.halt} by {made.by}{unwind}. Gates on this log "
            f"refuse new side effects within a second; `agent-saga resume --halt {made.halt} "
            "--reason ...` lifts it\n"
        )
    return EXIT_OK


def cmd_resume(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga resume``: end one halt or all of them."""
    ended = resume(open_wal(args), reason=args.reason, by=args.by, halt_id=args.halt_id)
    if args.json:
        json.dump([h.as_json() for h in ended], out, indent=2)
        out.write("\n")
    else:
        out.write("resumed: " + ", ".join(f"{h.halt} ({h.describe()})" for h in ended) + "\n")
    return EXIT_OK
