"""What the ``agent-saga`` subcommands share: the log they read, damage warnings,
tables and timestamps."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from . import _config
from ._cli_support import EXIT_DAMAGE, EXIT_OK
from .errors import SagaUsageError
from .wal.store import LogStore, open_store

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .wal.reader import Damage

__all__ = ["open_wal", "print_table", "report_damage", "timestamp"]


def timestamp(value: float | None) -> str:
    """A time as UTC text (``-`` when there is none)."""
    if value is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value)) + "Z"


def open_wal(args: argparse.Namespace) -> LogStore:
    """The log to read: ``--wal-path`` (before or after the action), else the default.

    Raises:
        SagaUsageError: two different ``--wal-path`` values, or a path that is not
            an existing, readable WAL file (``no WAL at PATH``).
    """
    outer: str | None = args.wal_path
    inner: str | None = getattr(args, "action_wal_path", None)
    if outer is not None and inner is not None and outer != inner:
        raise SagaUsageError(f"two different --wal-path values: {outer} and {inner}; give one")
    chosen = inner if inner is not None else outer
    store = open_store(str(_config.default_wal_path() if chosen is None else chosen))
    store.check(must_exist=True)
    return store


def report_damage(damages: Sequence[Damage], err: TextIO, what: str) -> int:
    """Warn about damage on stderr; return the exit code (1 when damaged)."""
    if not damages:
        return EXIT_OK
    first = damages[0]
    err.write(
        f"agent-saga: warning: the WAL has {len(damages)} damaged region(s) "
        f"(first at offset {first.offset}, {first.kind}); {what} may be incomplete; "
        "run `agent-saga wal verify`\n"
    )
    return EXIT_DAMAGE


def print_table(rows: list[list[str]], out: TextIO) -> None:
    """Print ``rows`` (the header first) as aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
