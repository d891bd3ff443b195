"""``agent-saga wal redact``: erase a saga's records, keeping the log verifiable.

What it does lives in :mod:`agent_saga.wal.redaction`; here are its flags and its
output. ``docs/redaction.md`` explains the command and what it cannot erase.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any, TextIO

from ._cli_common import open_wal
from ._cli_support import EXIT_OK
from .wal.redaction import RedactionReport, redact_saga

__all__ = ["add_redact_command", "cmd_redact", "print_redaction"]


def add_redact_command(
    wal_sub: Any, add_wal_path: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``wal redact`` to the ``wal`` subcommands."""
    p = wal_sub.add_parser(
        "redact",
        help="erase an ended saga's records (an erasure request); the log still verifies",
    )
    add_wal_path(p)
    p.add_argument("--saga", required=True, metavar="ID", help="the saga to redact")
    p.add_argument(
        "--reason", required=True, metavar="TEXT", help="why (recorded with the redaction)"
    )
    p.add_argument("--by", default=None, metavar="WHO", help="who asks (default: the OS user)")
    p.add_argument(
        "--vacuum-full",
        action="store_true",
        help="PostgreSQL: VACUUM FULL the tables after (rewrites them; locks them meanwhile)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=cmd_redact)


def cmd_redact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal redact``: exit 0 redacted (or already), 2 refused (one line)."""
    store = open_wal(args)
    report = redact_saga(
        store, args.saga, reason=args.reason, by=args.by, vacuum_full=args.vacuum_full
    )
    if args.json:
        out.write(json.dumps(dataclasses.asdict(report), indent=1) + "\n")
    else:
        print_redaction(report, out, cursor="offset" if store.kind == "file" else "seq")
    return EXIT_OK


def _runs(leaves: list[list[int]]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in leaves) or "none"


def print_redaction(report: RedactionReport, out: TextIO, *, cursor: str = "offset") -> None:
    """Print what a redaction did, a line per fact."""
    r = report
    who = f"by {r.by}: {r.reason}"
    if r.already:
        out.write(
            f"{r.location}: saga {r.saga} was already redacted ({who}; the redaction is leaf "
            f"{r.redaction_leaf}); nothing to do in the log\n"
        )
    elif r.resumed:
        out.write(
            f"{r.location}: finished the redaction of saga {r.saga} begun earlier ({who}): "
            f"{r.records} record(s) erased now, in leaves {_runs(r.leaves)}\n"
        )
    else:
        out.write(
            f"{r.location}: redacted saga {r.saga}: {r.records} record(s) erased, leaves "
            f"{_runs(r.leaves)}; the redaction is leaf {r.redaction_leaf} at {cursor} "
            f"{r.redaction_at} ({who})\n"
        )
    if r.archive_records:
        out.write(f"archive: {r.archive_records} record(s) erased\n")
    if r.snapshots_deleted:
        out.write(f"snapshots: {r.snapshots_deleted} deleted\n")
    if r.vacuumed is not None:
        out.write(f"postgresql: {r.vacuumed}\n")
