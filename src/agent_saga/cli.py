"""The ``agent-saga`` command line (also ``python -m agent_saga``).

Subcommands::

    agent-saga runs --wal-path P [--status S] [--json]
    agent-saga runs SAGA_ID --wal-path P [--json]
    agent-saga wal verify --wal-path P [--anchor FILE] [--json]
    agent-saga wal seal --wal-path P --out FILE|DIR|-      (with AGENT_SAGA_AUDIT_KEY set)
    agent-saga wal prove --wal-path P --saga ID [--out FILE]
    agent-saga wal encrypt --wal-path P     (with AGENT_SAGA_WAL_KEY set)
    agent-saga db migrate --wal-path postgresql://...
    agent-saga wal compact --wal-path P [--retain-seconds N] [--archive [PATH] | --no-archive]
                           [--force] [--json]
    agent-saga escalations --wal-path P [--all] [--json]
    agent-saga escalations resolve ID --note TEXT [--by WHO] [--wal-path P]
    agent-saga escalations retry ID --note TEXT [--by WHO] [--wal-path P]
    agent-saga approvals --wal-path P [--all] [--json]
    agent-saga approvals approve|deny ID --note TEXT [--as WHO] [--break-glass] [--wal-path P]
    agent-saga approvals --break-glass [--wal-path P]
    agent-saga approvals standing add --tool T (--digest D | --kwargs JSON | --arg A --max N)
                                      --expires WHEN --note TEXT [--as WHO]
    agent-saga approvals standing revoke ID [--note TEXT] | standing list [--json]
    agent-saga undo SAGA_ID --wal-path P --reason TEXT [--from-step N] [--dry-run] [--json]
                    [--as NAME] [--import MODULE ...]     (docs/undo.md)
    agent-saga ui [--wal-path P] [--host H] [--port N] [--token T] [--quiet]
    agent-saga mcp --policy FILE [--wal-path P] [--boundary session|explicit] [--observe]
                   -- SERVER_COMMAND [ARGS...]    (see docs/mcp.md; its own exit codes)
    agent-saga --version

Exit codes:

* 0 — success.
* 1 — the command did its job but the log is damaged: ``wal verify`` found damage
  or records changed, removed, inserted or reordered (``wal prove``: records the
  latest checkpoint does not cover yet),
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

The parser and the dispatch are here; each command group's implementation has its
own module: ``_cli_runs`` (``runs``), ``_cli_wal`` (``wal``, ``db``), ``_cli_audit``
(``wal seal``, ``wal prove``, the tree half of ``wal verify``), ``_cli_queues``
(``escalations``, ``approvals``); what they share is in ``_cli_common``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from ._cli_audit import add_audit_commands
from ._cli_halt import add_halt_commands
from ._cli_limits import add_limits_command
from ._cli_queues import add_standing_commands, cmd_approvals, cmd_escalations
from ._cli_runs import RUN_STATUSES, cmd_runs
from ._cli_support import (
    EXIT_BUG,
    EXIT_OK,
    EXIT_USAGE,
    bug_line,
    conflict_message,
    conflicting_distribution,
    non_negative_seconds,
    version_line,
)
from ._cli_undo import add_undo_command
from ._cli_wal import cmd_compact, cmd_db_migrate, cmd_encrypt, cmd_verify
from .errors import SagaError

__all__ = ["RUN_STATUSES", "build_parser", "main"]


_WAL_HELP = "the WAL file (default: $AGENT_SAGA_WAL_PATH or ./agent-saga.wal)"


def _add_wal_path(p: argparse.ArgumentParser, dest: str = "wal_path") -> None:
    p.add_argument("--wal-path", dest=dest, default=None, metavar="PATH", help=_WAL_HELP)


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
    p.add_argument("--as", "--by", dest="by", default=None, metavar="NAME", help=by_help)
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
        help="list sagas and their state, or show one saga",
        description="List sagas: status (with the owner's lease: running, "
        "'running (owner silent, orphaned in N s)', orphaned), steps, start, outcome. "
        "With SAGA_ID: that saga's status, history, steps, decisions, escalations and "
        "records. Statuses: docs/concepts.md.",
    )
    runs.add_argument(
        "saga",
        nargs="?",
        default=None,
        metavar="SAGA_ID",
        help="show this saga (or the one saga whose id starts so) in detail",
    )
    _add_wal_path(runs)
    runs.add_argument(
        "--status",
        choices=RUN_STATUSES,
        metavar="STATUS",
        help=f"only sagas with this status: {', '.join(RUN_STATUSES)}",
    )
    runs.add_argument("--json", action="store_true", help="print one JSON document")
    runs.set_defaults(handler=cmd_runs)

    wal = sub.add_parser("wal", help="verify or compact a WAL")
    wal_sub = wal.add_subparsers(dest="wal_command", required=True, metavar="ACTION")

    verify = wal_sub.add_parser(
        "verify", help="report damage and check the Merkle tree against checkpoints (exit 1)"
    )
    _add_wal_path(verify)
    verify.add_argument(
        "--anchor", metavar="FILE", help="a checkpoint kept outside the log (wal seal --out)"
    )
    verify.add_argument("--json", action="store_true", help="print one JSON document")
    verify.set_defaults(handler=cmd_verify)
    add_audit_commands(wal_sub, _add_wal_path)

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
    compact.set_defaults(handler=cmd_compact)

    encrypt = wal_sub.add_parser(
        "encrypt", help="encrypt a plaintext log and its snapshots in place (AGENT_SAGA_WAL_KEY)"
    )
    _add_wal_path(encrypt)
    encrypt.set_defaults(handler=cmd_encrypt)

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
    migrate.set_defaults(handler=cmd_db_migrate)

    esc = sub.add_parser("escalations", help="list the human queue, or resolve an item")
    _add_wal_path(esc)
    esc.add_argument("--all", action="store_true", help="include resolved escalations")
    esc.add_argument("--json", action="store_true", help="print one JSON document")
    esc.set_defaults(handler=cmd_escalations)
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
    apr.add_argument(
        "--json", action="store_true", help="print each request's story as one JSON document"
    )
    apr.add_argument(
        "--break-glass",
        dest="list_break_glass",
        action="store_true",
        help="list every break-glass decision, for review",
    )
    apr.set_defaults(handler=cmd_approvals)
    apr_sub = apr.add_subparsers(dest="apr_command", metavar="ACTION")
    for action, verb in (("approve", "let the step run"), ("deny", "refuse the step")):
        decide = apr_sub.add_parser(
            action,
            help=f"{verb} (recorded durably in the log)",
            description=f"{verb.capitalize()}: record the decision durably in the log.",
        )
        _add_decision_options(decide, "the request id (apr-...)", "why; recorded with the decision")
        decide.add_argument(
            "--break-glass",
            action="store_true",
            help="an emergency decision: recorded break_glass, listed for review "
            "(an approval settles the request alone, whatever its quorum); needs --note",
        )
    add_standing_commands(apr_sub, _add_wal_path)

    add_undo_command(sub, _add_wal_path)

    from .ui._cli import add_arguments as add_ui_arguments
    from .ui._cli import run as run_ui

    add_limits_command(sub, _add_wal_path)
    add_halt_commands(sub, _add_wal_path)

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
