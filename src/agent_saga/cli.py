"""The ``agent-saga`` command line (also ``python -m agent_saga``).

Subcommands::

    agent-saga runs --wal-path P [--status S] [--json]
    agent-saga wal verify --wal-path P [--json]
    agent-saga wal encrypt --wal-path P     (with AGENT_SAGA_WAL_KEY set)
    agent-saga db migrate --wal-path postgresql://...
    agent-saga wal compact --wal-path P [--retain-seconds N] [--archive [PATH] | --no-archive]
                           [--force] [--json]
    agent-saga escalations --wal-path P [--all] [--json]
    agent-saga escalations resolve ID --note TEXT [--by WHO] [--wal-path P]
    agent-saga escalations retry ID --note TEXT [--by WHO] [--wal-path P]
    agent-saga approvals --wal-path P [--all] [--json]
    agent-saga approvals approve|deny ID --note TEXT [--by WHO] [--wal-path P]
    agent-saga ui [--wal-path P] [--host H] [--port N] [--token T] [--quiet]
    agent-saga mcp --policy FILE [--wal-path P] [--boundary session|explicit] [--observe]
                   -- SERVER_COMMAND [ARGS...]    (see docs/mcp.md; its own exit codes)
    agent-saga --version

Exit codes:

* 0 — success.
* 1 — the command did its job but the log is damaged: ``wal verify`` found damage,
  or ``runs`` / ``escalations`` / ``approvals`` printed what they could read and
  reported the damage on stderr (the listing may be incomplete).
* 2 — a usage error or any expected error, printed as one line
  ``agent-saga: error: ...``: bad arguments, a ``--wal-path`` that is missing
  (``no WAL at PATH``), a directory, a FIFO, unreadable, a ``SagaError``.
* 70 — an exception nobody expected: one line naming its type and where it was
  raised, "this is a bug, please report it". Never a traceback.
* 130 — interrupted (Ctrl-C); 141 — stdout was closed (``| head``).

Every command reads an existing log: none of them creates a file or a directory
except ``wal compact`` (which needs ``<wal>.d/`` for its lock and writes the
archive), ``wal encrypt`` (which rewrites the log it was given) and the deciding
commands (``resolve``, ``retry``, ``approve``, ``deny``), which append one record.
Values are printed exactly as they were recorded: the log holds credential
*references*, never credentials, so nothing here needs to redact.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TextIO

from . import _config
from ._cli_support import (
    EXIT_BUG,
    EXIT_DAMAGE,
    EXIT_OK,
    EXIT_USAGE,
    bug_line,
    conflict_message,
    conflicting_distribution,
    non_negative_seconds,
    version_line,
)
from .errors import SagaError, SagaUsageError
from .recovery.liveness import Liveness
from .wal.records import TERMINAL_OUTCOMES
from .wal.store import FileStore, LogStore, open_store

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .wal.reader import Damage
    from .wal.state import ApprovalView, SagaView, StepView

__all__ = ["RUN_STATUSES", "build_parser", "main"]

RUN_STATUSES: tuple[str, ...] = (
    "running",
    "rolling_back",
    "recovering",
    "orphaned",
    *sorted(TERMINAL_OUTCOMES),
)
"""What ``runs --status`` accepts: the statuses ``SagaFold`` gives live sagas, the
terminal outcomes, and ``orphaned`` (no live owner, no daemon: the next
``saga-recoveryd`` pass takes it over)."""


def _ts(value: float | None) -> str:
    if value is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value)) + "Z"


_WAL_HELP = "the WAL file (default: $AGENT_SAGA_WAL_PATH or ./agent-saga.wal)"


def _add_wal_path(p: argparse.ArgumentParser, dest: str = "wal_path") -> None:
    p.add_argument("--wal-path", dest=dest, default=None, metavar="PATH", help=_WAL_HELP)


def _wal_path(args: argparse.Namespace) -> LogStore:
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


def _report_damage(damages: Sequence[Damage], err: TextIO, what: str) -> int:
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


# ---- runs ---------------------------------------------------------------------------


def _step_json(s: StepView) -> dict[str, Any]:
    return {
        "step": s.step,
        "tool": s.tool,
        "semantics": s.semantics,
        "state": s.state,
        "attempts": s.attempts,
        "kwargs": s.kwargs,
        "idempotency_key": s.idempotency_key,
        "resolver": s.resolver,
        "preimage": s.preimage,
        "handler": s.handler,
        "compensation_kwargs": s.compensation_kwargs,
        "token": s.token,
        "order": s.order,
        "error": s.error,
        "escalation": s.escalation,
    }


def _saga_json(v: SagaView, live: Liveness) -> dict[str, Any]:
    claim = v.claim
    return {
        "saga": v.saga_id,
        "name": v.name,
        "owner": v.owner,
        "status": live.status,
        "logged_status": v.status,
        "owner_silent": live.owner_silent,
        "lease_state": live.lease_state,
        "lease_expires": live.lease_expires,
        "lease_renewed": live.lease_renewed,
        "orphaned_in": None if live.orphaned_in is None else round(live.orphaned_in, 3),
        "started": v.started,
        "ended": v.ended,
        "outcome": v.outcome,
        "claim": None
        if claim is None
        else {"by": claim.by, "fence": claim.fence, "expires": claim.expires},
        "escalations": list(v.escalations),
        "steps": [_step_json(s) for s in sorted(v.steps.values(), key=lambda s: s.step)],
    }


def _steps_summary(v: SagaView) -> str:
    counts: dict[str, int] = {}
    for s in v.steps.values():
        counts[s.state] = counts.get(s.state, 0) + 1
    if not counts:
        return "0"
    detail = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{len(v.steps)} ({detail})"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")


TABLE_BLOCK = 1000
"""Rows a streamed table measures its column widths on before printing them."""


class _StreamedTable:
    """A table printed as it comes: blocks of :data:`TABLE_BLOCK` rows, aligned.

    Column widths are those of the header and the first block, and only ever grow:
    a later block with a wider cell widens its column from that block on. A listing
    of up to one block is laid out exactly as if it had been measured whole.
    """

    def __init__(self, header: list[str], out: TextIO) -> None:
        self._out = out
        self._rows = [header]
        self._widths = [0] * len(header)
        self.rows = 0  # rows added, the header not counted

    def add(self, row: list[str]) -> None:
        self._rows.append(row)
        self.rows += 1
        if len(self._rows) >= TABLE_BLOCK:
            self.flush()

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        for i in range(len(self._widths)):
            self._widths[i] = max(self._widths[i], *(len(row[i]) for row in rows))
        for row in rows:
            line = "  ".join(c.ljust(w) for c, w in zip(row, self._widths, strict=True))
            self._out.write(line.rstrip() + "\n")


class _JsonArray:
    """A JSON array written one element at a time, byte for byte what ``json.dump``
    of the whole list with ``indent=2`` prints."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.count = 0

    def add(self, item: Any) -> None:
        text = json.dumps(item, indent=2, default=str)
        self._out.write("[\n  " if self.count == 0 else ",\n  ")
        self._out.write(text.replace("\n", "\n  "))  # JSON strings hold no raw newline
        self.count += 1

    def close(self) -> None:
        self._out.write("[]\n" if self.count == 0 else "\n]\n")


def _judge(views: Iterable[SagaView], wal: LogStore) -> Iterator[tuple[SagaView, Liveness]]:
    """Pair each saga with the daemon's view of it (leases read once per owner)."""
    from .recovery.liveness import liveness
    from .wal.lease import LeaseInfo

    table = wal.leases()
    leases: dict[str, LeaseInfo | None] = {}
    now = wal.now()
    for v in views:
        lease = None
        if v.owner and not v.terminal:
            if v.owner not in leases:
                leases[v.owner] = table.get(v.owner)
            lease = leases[v.owner]
        yield v, liveness(v, lease, now)


def _start_key(v: SagaView) -> tuple[bool, float, str]:
    return (v.started is None, v.started or 0.0, v.saga_id)


class _RunsPrinter:
    """Prints each saga of ``runs`` as soon as it is final, keeping nothing of it."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self._status: str | None = args.status
        self._json = _JsonArray(out) if args.json else None
        self._table = (
            None
            if args.json
            else _StreamedTable(["SAGA", "NAME", "STATUS", "STEPS", "STARTED", "OUTCOME"], out)
        )
        self._out = out

    def settled(self, v: SagaView) -> None:
        """``SagaFold(on_settled=...)``: a terminal saga nothing can change any more."""
        from .recovery.liveness import liveness

        self.print(v, liveness(v, None, 0.0))  # terminal: no lease, no clock

    def print(self, v: SagaView, live: Liveness) -> None:
        if self._status is not None and live.status != self._status:
            return
        if self._json is not None:
            self._json.add(_saga_json(v, live))
            return
        assert self._table is not None
        self._table.add(
            [
                v.saga_id,
                v.name or "-",
                live.describe(),
                _steps_summary(v),
                _ts(v.started),
                v.outcome or "-",
            ]
        )

    def close(self) -> None:
        if self._json is not None:
            self._json.close()
            return
        assert self._table is not None
        if self._table.rows == 0:
            self._out.write("no sagas\n")
            return
        self._table.flush()


def _cmd_runs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .wal.state import SagaFold

    wal = _wal_path(args)
    printer = _RunsPrinter(args, out)
    # Bounded and streaming: a saga is printed (and forgotten) as soon as it is final;
    # only live sagas and ended ones with an open escalation are held to the end.
    fold = SagaFold(forget_terminal=True, remember_ended=False, on_settled=printer.settled)
    fold.feed(wal.scan())
    for v, live in _judge(sorted(fold.sagas(), key=_start_key), wal):
        printer.print(v, live)
    printer.close()
    code = _report_damage(fold.damages, err, "the list of sagas")
    if fold.late_records:
        offset, saga_id, rtype = fold.late_examples[0]
        err.write(
            f"agent-saga: note: {fold.late_records} record(s) came after the end of sagas "
            f"already listed (first: {rtype} of saga {saga_id} at offset {offset}); "
            "`agent-saga escalations` lists any escalation among them\n"
        )
    return code


# ---- wal verify / compact -----------------------------------------------------------


def _cmd_verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    report = _wal_path(args).verify()
    if args.json:
        json.dump(
            {
                "path": report.path,
                "size": report.size,
                "records": report.records,
                "by_type": report.by_type,
                "damages": [asdict(d) for d in report.damages],
                "repairs": report.repairs,
                "encrypted": report.encrypted,
                "ok": report.ok,
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        out.write(f"{report.path}: {report.records} records, {report.size} bytes\n")
        for r in report.repairs:
            out.write(
                f"repaired a torn tail at offset {r['offset']}: {r['length']} bytes cut after "
                f"a crash mid-write (saved as {r.get('saved')}); not damage\n"
            )
        for d in report.damages:
            out.write(f"damage at offset {d.offset}: {d.length} bytes, {d.kind} ({d.detail})\n")
        out.write("ok\n" if report.ok else f"{len(report.damages)} damaged region(s)\n")
    return EXIT_OK if report.ok else EXIT_DAMAGE


def _cmd_compact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    archive: bool | str = False if args.no_archive else args.archive
    store = _wal_path(args)
    layout: dict[str, int] = {}
    if args.log_format is not None:
        if not isinstance(store, FileStore):
            raise SagaUsageError(
                f"--format picks a WAL file's layout; {store.display} is a {store.kind} log"
            )
        layout["log_format"] = args.log_format
    report = store.compact(
        archive=archive, retain_seconds=args.retain_seconds, force=args.force, **layout
    )
    if args.json:
        data = asdict(report)
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return EXIT_OK
    out.write(
        f"{report.path}: kept {report.records_kept} records of {report.sagas_kept} sagas "
        f"({report.tail_records} appended meanwhile), dropped {report.records_dropped} "
        f"records of {report.sagas_dropped} sagas; {report.bytes_before} -> "
        f"{report.bytes_after} bytes\n"
    )
    if report.archive is not None and report.records_dropped:
        out.write(f"archived dropped records to {report.archive}\n")
    for d in report.damages:
        out.write(f"removed damage at offset {d.offset}: {d.length} bytes, {d.kind}\n")
    for q in report.quarantined:
        out.write(f"damaged bytes saved to {q}\n")
    return EXIT_OK


def _cmd_encrypt(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .wal.encryption import encryptor_from_env
    from .wal.migrate import encrypt_log

    encryptor = encryptor_from_env()
    if encryptor is None:
        raise SagaUsageError(
            "set AGENT_SAGA_WAL_KEY to the key to encrypt the log with (base64 of 32 bytes)"
        )
    store = _wal_path(args)
    if not isinstance(store, FileStore):
        raise SagaUsageError(
            f"wal encrypt rewrites a WAL file; {store.display} is a {store.kind} log "
            "(set the key before its first record instead)"
        )
    report = encrypt_log(store.path, encryptor)
    if report.already:
        out.write(f"{report.path}: already encrypted with this key")
    else:
        out.write(
            f"{report.path}: sealed {report.records} records "
            f"({report.bytes_before} -> {report.bytes_after} bytes)"
        )
    out.write(f"; {report.snapshots} snapshot(s) re-stored sealed\n")
    return EXIT_OK


# ---- db migrate ---------------------------------------------------------------------


def _cmd_db_migrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    location = str(args.wal_path or _config.default_wal_path())
    store = open_store(location)
    migrate: Callable[[], Any] | None = getattr(store, "migrate", None)
    if migrate is None:
        raise SagaUsageError(
            f"db migrate sets up a database log; {store.display} is a {store.kind} log, "
            "which needs no schema (give --wal-path postgresql://...)"
        )
    report = migrate()
    if report.changed:
        out.write(
            f"{report.location}: schema {report.schema} migrated from version "
            f"{report.before} to {report.after}\n"
        )
    else:
        out.write(
            f"{report.location}: schema {report.schema} is up to date (version {report.after})\n"
        )
    return EXIT_OK


# ---- escalations -------------------------------------------------------------------


def _cmd_escalations(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .recovery.escalations import fold_escalations, request_retry, resolve_escalation

    if getattr(args, "esc_command", None) == "resolve":
        found = resolve_escalation(_wal_path(args), args.id, note=args.note, by=args.by)
        out.write(f"resolved {found.escalation} (saga {found.saga_id}, step {found.step})\n")
        return EXIT_OK
    if getattr(args, "esc_command", None) == "retry":
        found = request_retry(_wal_path(args), args.id, note=args.note, by=args.by)
        out.write(
            f"retry of {found.escalation} requested (saga {found.saga_id}, step {found.step}); "
            "the next `saga-recoveryd --once` (with the --import your handlers need) "
            "retries it with the same recovery token\n"
        )
        return EXIT_OK
    # The queue's records only; an escalation is kept while open (--all: all of them).
    fold = fold_escalations(_wal_path(args), include_resolved=args.all)
    items = fold.escalations() if args.all else fold.open_escalations()
    code = _report_damage(fold.damages, err, "the human queue above")
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
        rows.append([e.escalation, e.saga_id, step, _ts(e.ts), state, e.reason])
    _table(rows, out)
    return code


# ---- approvals ---------------------------------------------------------------------


def _approval_state(a: ApprovalView, now: float) -> str:
    if a.decided:
        return f"{a.decision} by {a.decided_by}"
    if a.saga_ended:
        return "saga ended"
    return "expired" if a.expired(now) else "open"


def _cmd_approvals(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .approvals import decide_approval, fold_approvals

    action = getattr(args, "apr_command", None)
    if action in ("approve", "deny"):
        a = decide_approval(
            _wal_path(args), args.id, approve=action == "approve", note=args.note, by=args.by
        )
        out.write(
            f"{a.decision} {a.request} (saga {a.saga_id}, step {a.step}, tool {a.tool}) "
            f"by {a.decided_by}\n"
        )
        return EXIT_OK
    # The queue's records and saga begin/end only; a request is kept while its saga
    # has not ended (--all: every request, what it prints).
    fold = fold_approvals(_wal_path(args), include_closed=args.all)
    now = time.time()
    items = fold.approvals() if args.all else fold.open_approvals(now=now)
    code = _report_damage(fold.damages, err, "the approval queue above")
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
                _ts(a.ts),
                _ts(a.expires),
                _approval_state(a, now),
            ]
        )
    _table(rows, out)
    return code


# ---- parser -------------------------------------------------------------------------


def _add_decision_options(
    p: argparse.ArgumentParser,
    id_help: str,
    note_help: str,
    *,
    by_help: str = "who decided (default: the OS user)",
) -> None:
    p.add_argument("id", help=id_help)
    p.add_argument("--note", required=True, help=note_help)
    p.add_argument("--by", default=None, help=by_help)
    # Accepted after the action too (``approvals approve ID --wal-path P``).
    _add_wal_path(p, dest="action_wal_path")


def _cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .mcp._cli import run

    return run(
        policy_file=args.policy,
        server_command=args.server_command,
        wal_path=args.wal_path,
        boundary=args.boundary,
        observe=args.observe,
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the ``agent-saga`` argument parser.

    Returns:
        The parser; each subcommand sets ``handler``.
    """
    from .wal.compaction import DEFAULT_RETAIN_SECONDS

    parser = argparse.ArgumentParser(
        prog="agent-saga",
        description="Inspect and maintain agent-saga write-ahead logs.",
        epilog="Exit codes: 0 ok, 1 the log is damaged, 2 usage or expected error, "
        "70 a bug. Reference: docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    runs = sub.add_parser(
        "runs",
        help="list sagas and their state",
        description="List sagas: status (with the owner's lease: running, "
        "'running (owner silent, orphaned in N s)', orphaned), steps, start, outcome.",
    )
    _add_wal_path(runs)
    runs.add_argument(
        "--status",
        choices=RUN_STATUSES,
        metavar="STATUS",
        help=f"only sagas with this status: {', '.join(RUN_STATUSES)}",
    )
    runs.add_argument("--json", action="store_true", help="print one JSON document")
    runs.set_defaults(handler=_cmd_runs)

    wal = sub.add_parser("wal", help="verify or compact a WAL")
    wal_sub = wal.add_subparsers(dest="wal_command", required=True, metavar="ACTION")

    verify = wal_sub.add_parser("verify", help="count records and report damage (exit 1)")
    _add_wal_path(verify)
    verify.add_argument("--json", action="store_true", help="print one JSON document")
    verify.set_defaults(handler=_cmd_verify)

    compact = wal_sub.add_parser("compact", help="drop sagas that ended long enough ago")
    _add_wal_path(compact)
    compact.add_argument(
        "--retain-seconds",
        type=non_negative_seconds,
        default=DEFAULT_RETAIN_SECONDS,
        metavar="N",
        help="keep sagas that ended less than N seconds ago (default: 7 days)",
    )
    policy = compact.add_mutually_exclusive_group()
    policy.add_argument(
        "--archive",
        nargs="?",
        const=True,
        default=True,
        metavar="PATH",
        help="append dropped records to PATH (default: <wal>.archive; this is the default)",
    )
    policy.add_argument(
        "--no-archive", action="store_true", help="drop records without keeping an audit trail"
    )
    compact.add_argument(
        "--force", action="store_true", help="compact despite damage (damaged bytes saved aside)"
    )
    compact.add_argument(
        "--format",
        dest="log_format",
        type=int,
        choices=(1, 2),
        default=None,
        help="rewrite a WAL file in layout 1 (append + fsync) or 2 (preallocated, the "
        "default for new logs; docs/log-format.md §11); default: keep its layout",
    )
    compact.add_argument("--json", action="store_true", help="print the report as JSON")
    compact.set_defaults(handler=_cmd_compact)

    encrypt = wal_sub.add_parser(
        "encrypt", help="encrypt a plaintext log and its snapshots in place (AGENT_SAGA_WAL_KEY)"
    )
    _add_wal_path(encrypt)
    encrypt.set_defaults(handler=_cmd_encrypt)

    db = sub.add_parser("db", help="manage a database log (postgresql:// WAL locations)")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    migrate = db_sub.add_parser(
        "migrate",
        help="create or upgrade the log schema (idempotent; safe to run on every deploy)",
        description="Create or upgrade the agent-saga log schema at a postgresql:// "
        "WAL location and record its version. Running it again changes nothing.",
    )
    migrate.add_argument(
        "--wal-path",
        dest="wal_path",
        default=None,
        metavar="URL",
        help="the postgresql:// log (default: $AGENT_SAGA_WAL_PATH)",
    )
    migrate.set_defaults(handler=_cmd_db_migrate)

    esc = sub.add_parser("escalations", help="list the human queue, or resolve an item")
    _add_wal_path(esc)
    esc.add_argument("--all", action="store_true", help="include resolved escalations")
    esc.add_argument("--json", action="store_true", help="print one JSON document")
    esc.set_defaults(handler=_cmd_escalations)
    esc_sub = esc.add_subparsers(dest="esc_command", metavar="ACTION")
    resolve = esc_sub.add_parser(
        "resolve",
        help="record a human's decision on one escalation",
        description="Record, durably in the log, that a human dealt with an escalation.",
    )
    _add_decision_options(resolve, "the escalation id (esc-...)", "what was done or decided")
    retry = esc_sub.add_parser(
        "retry",
        help="have saga-recoveryd try an escalated step again once its cause is fixed",
        description="Record, durably in the log, that an escalated step may be retried: the "
        "next saga-recoveryd pass runs it again with the same recovery token.",
    )
    _add_decision_options(
        retry,
        "the escalation id (esc-...)",
        "what was fixed (recorded)",
        by_help="who asks (default: the OS user)",
    )

    apr = sub.add_parser("approvals", help="list approval requests, or approve/deny one")
    _add_wal_path(apr)
    apr.add_argument("--all", action="store_true", help="include decided and expired requests")
    apr.add_argument("--json", action="store_true", help="print one JSON document")
    apr.set_defaults(handler=_cmd_approvals)
    apr_sub = apr.add_subparsers(dest="apr_command", metavar="ACTION")
    for action, verb in (("approve", "let the step run"), ("deny", "refuse the step")):
        decide = apr_sub.add_parser(
            action,
            help=f"{verb} (recorded durably in the log)",
            description=f"{verb.capitalize()}: record the decision durably in the log.",
        )
        _add_decision_options(decide, "the request id (apr-...)", "why; recorded with the decision")

    from .ui._cli import add_arguments as add_ui_arguments
    from .ui._cli import run as run_ui

    mcp = sub.add_parser(
        "mcp",
        help="run an MCP server behind a proxy that makes its tool calls saga steps",
        usage="agent-saga mcp --policy FILE [--wal-path PATH] [--boundary session|explicit] "
        "[--observe] -- SERVER_COMMAND [ARGS...]",
    )
    mcp.add_argument("--policy", required=True, help="the policy file (TOML or JSON)")
    _add_wal_path(mcp)
    mcp.add_argument("--boundary", choices=["session", "explicit"], default="session")
    mcp.add_argument(
        "--observe", action="store_true", help="forward and record only; write a policy skeleton"
    )
    mcp.set_defaults(handler=_cmd_mcp, server_command=[])

    ui = sub.add_parser("ui", help="time-travel debugger: a web page over the WAL")
    add_ui_arguments(ui)
    ui.set_defaults(handler=run_ui)
    return parser


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    server: list[str] = []
    if argv[:1] == ["mcp"] and "--" in argv:  # everything after `--` is the server's
        cut = argv.index("--")
        argv, server = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(argv)
        if server:
            args.server_command = server
    except SystemExit as exc:  # argparse: --help/--version exit 0, usage errors exit 2
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    other = conflicting_distribution()
    if other is not None:
        sys.stderr.write(conflict_message("agent-saga", other) + "\n")
        return EXIT_USAGE
    handler: Callable[[argparse.Namespace, TextIO, TextIO], int] = args.handler
    try:
        return handler(args, sys.stdout, sys.stderr)
    except SagaError as exc:
        sys.stderr.write(f"agent-saga: error: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        raise
    except OSError as exc:  # the environment said no (permissions, disk full, ...)
        where = f": {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"agent-saga: error: {exc.strerror or exc}{where}\n")
        return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agent-saga``.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 ok, 1 the log is damaged, 2 usage or expected error, 70 an
        unexpected exception (a bug), 130 interrupted, 141 stdout closed (see the
        module docstring).
    """
    try:
        return _run(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except Exception as exc:
        sys.stderr.write(bug_line("agent-saga", exc) + "\n")
        return EXIT_BUG


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
