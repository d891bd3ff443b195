"""``agent-saga limits``: every budget and rate limit of a log, its use per key and window."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, TextIO

from ._cli_common import open_wal, print_table, report_damage
from .wal.limits import UsageFold, window_words
from .wal.reader import Damage, Record

__all__ = ["add_limits_command", "cmd_limits"]


def add_limits_command(sub: Any, add_wal_path: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``agent-saga limits`` on the ``agent-saga`` subparsers."""
    p = sub.add_parser(
        "limits",
        help="budgets and rate limits: use per limit, key and window",
        description="Show every limit declared in the log (its latest definition) and, per "
        "key, what is used and held by calls in flight in the window that holds now. "
        "Derived from the log alone, in one streamed pass.",
    )
    add_wal_path(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=cmd_limits)


def cmd_limits(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga limits``: the limits' use now."""
    store = open_wal(args)
    fold = UsageFold()
    damages: list[Damage] = []
    for item in store.scan():
        if isinstance(item, Record):
            fold.apply(item.data)
        else:
            damages.append(item)
    now = time.time()
    meters = fold.meters(now)
    code = report_damage(damages, err, "the usage below")
    if args.json:
        doc = {
            "now": now,
            "limits": [
                {**spec.definition(), "digest": spec.digest, "window_words": window_words(spec)}
                for spec in fold.declared.values()
            ],
            "meters": [
                {
                    "limit": u.limit,
                    "key": u.key,
                    "period": u.period,
                    "used": u.used,
                    "held": u.held,
                    "max": u.max,
                    "remaining": u.remaining,
                }
                for u in meters
            ],
        }
        json.dump(doc, out, indent=2)
        out.write("\n")
        return code
    if not fold.declared:
        out.write("no limits declared in this log\n")
        return code
    rows = [["LIMIT", "KEY", "WINDOW", "USED", "HELD", "MAX", "REMAINING"]]
    for u in meters:
        spec = fold.declared[u.limit]
        rows.append(
            [
                u.limit,
                "-" if u.key is None else u.key,
                window_words(spec) + ("" if u.period is None else f" ({u.period})"),
                f"{u.used:g}",
                f"{u.held:g}",
                f"{u.max:g}",
                f"{u.remaining:g}",
            ]
        )
    for name, spec in sorted(fold.declared.items()):
        if not any(u.limit == name for u in meters):
            rows.append([name, "-", window_words(spec), "0", "0", f"{spec.max:g}", f"{spec.max:g}"])
    print_table(rows, out)
    return code
