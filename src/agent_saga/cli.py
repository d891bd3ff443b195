"""The ``agent-saga`` command line (also ``python -m agent_saga``).

Subcommands::

    agent-saga runs --wal-path P [--status S] [--json]
    agent-saga wal verify --wal-path P [--json]
    agent-saga wal encrypt --wal-path P     (with AGENT_SAGA_WAL_KEY set)
    agent-saga wal compact --wal-path P [--retain-seconds N] [--archive [PATH] | --no-archive]
                           [--force] [--json]
    agent-saga escalations --wal-path P [--all] [--json]
    agent-saga escalations resolve ID --note TEXT [--by WHO] --wal-path P
    agent-saga escalations retry ID --note TEXT [--by WHO] --wal-path P
    agent-saga approvals --wal-path P [--all] [--json]
    agent-saga approvals approve|deny ID --note TEXT [--by WHO] --wal-path P
    agent-saga ui ...            (placeholder)

Exit codes: 0 success; 1 ``wal verify`` found damage; 2 usage errors and every
expected error (a ``SagaError``, printed as one line ``agent-saga: error: ...``).
Values are printed exactly as they were recorded: the log holds credential
*references*, never credentials, so nothing here needs to redact.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TextIO

from . import _config
from .errors import SagaError, SagaUsageError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .wal.state import ApprovalView, SagaView, StepView

__all__ = ["main"]

_NOT_YET = "not yet implemented (see issue: {} command pending)"


def _ts(value: float | None) -> str:
    if value is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value)) + "Z"


def _add_wal_path(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wal-path",
        default=None,
        help="the WAL file (default: $AGENT_SAGA_WAL_PATH or ./agent-saga.wal)",
    )


def _wal_path(args: argparse.Namespace) -> str:
    return str(args.wal_path or _config.default_wal_path())


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


def _saga_json(v: SagaView) -> dict[str, Any]:
    claim = v.claim
    return {
        "saga": v.saga_id,
        "name": v.name,
        "owner": v.owner,
        "status": v.status,
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


def _cmd_runs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .wal.state import fold_file

    fold, damages = fold_file(_wal_path(args))
    views = sorted(fold.sagas(), key=lambda v: (v.started is None, v.started or 0.0, v.saga_id))
    if args.status:
        views = [v for v in views if v.status == args.status]
    if damages:
        err.write(
            f"agent-saga: warning: the WAL has {len(damages)} damaged region(s); "
            "run `agent-saga wal verify`\n"
        )
    if args.json:
        json.dump([_saga_json(v) for v in views], out, indent=2, default=str)
        out.write("\n")
        return 0
    if not views:
        out.write("no sagas\n")
        return 0
    rows = [["SAGA", "NAME", "STATUS", "STEPS", "STARTED", "OUTCOME"]]
    rows += [
        [v.saga_id, v.name or "-", v.status, _steps_summary(v), _ts(v.started), v.outcome or "-"]
        for v in views
    ]
    _table(rows, out)
    return 0


# ---- wal verify / compact -----------------------------------------------------------


def _cmd_verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .wal.reader import verify

    report = verify(_wal_path(args))
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
    return 0 if report.ok else 1


def _cmd_compact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .wal.compaction import compact

    archive: bool | str = False if args.no_archive else args.archive
    report = compact(
        _wal_path(args),
        archive=archive,
        retain_seconds=args.retain_seconds,
        force=args.force,
    )
    if args.json:
        data = asdict(report)
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return 0
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
    return 0


def _cmd_encrypt(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .wal.encryption import encryptor_from_env
    from .wal.migrate import encrypt_log

    encryptor = encryptor_from_env()
    if encryptor is None:
        raise SagaUsageError(
            "set AGENT_SAGA_WAL_KEY to the key to encrypt the log with (base64 of 32 bytes)"
        )
    report = encrypt_log(_wal_path(args), encryptor)
    if report.already:
        out.write(f"{report.path}: already encrypted with this key")
    else:
        out.write(
            f"{report.path}: sealed {report.records} records "
            f"({report.bytes_before} -> {report.bytes_after} bytes)"
        )
    out.write(f"; {report.snapshots} snapshot(s) re-stored sealed\n")
    return 0


# ---- escalations -------------------------------------------------------------------


def _cmd_escalations(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .recovery.escalations import list_escalations, request_retry, resolve_escalation

    if getattr(args, "esc_command", None) == "resolve":
        found = resolve_escalation(_wal_path(args), args.id, note=args.note, by=args.by)
        out.write(f"resolved {found.escalation} (saga {found.saga_id}, step {found.step})\n")
        return 0
    if getattr(args, "esc_command", None) == "retry":
        found = request_retry(_wal_path(args), args.id, note=args.note, by=args.by)
        out.write(
            f"retry of {found.escalation} requested (saga {found.saga_id}, step {found.step}); "
            "the next `saga-recoveryd --once` (with the --import your handlers need) "
            "retries it with the same recovery token\n"
        )
        return 0
    items = list_escalations(_wal_path(args), include_resolved=args.all)
    if args.json:
        json.dump([asdict(e) for e in items], out, indent=2, default=str)
        out.write("\n")
        return 0
    if not items:
        out.write("no open escalations\n")
        return 0
    rows = [["ESCALATION", "SAGA", "STEP", "RAISED", "STATE", "REASON"]]
    for e in items:
        state = f"resolved by {e.resolved_by}" if e.resolved else "open"
        step = "-" if e.step is None else str(e.step)
        rows.append([e.escalation, e.saga_id, step, _ts(e.ts), state, e.reason])
    _table(rows, out)
    return 0


# ---- approvals ---------------------------------------------------------------------


def _approval_state(a: ApprovalView, now: float) -> str:
    if a.decided:
        return f"{a.decision} by {a.decided_by}"
    if a.saga_ended:
        return "saga ended"
    return "expired" if a.expired(now) else "open"


def _cmd_approvals(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .approvals import decide_approval, list_approvals

    action = getattr(args, "apr_command", None)
    if action in ("approve", "deny"):
        a = decide_approval(
            _wal_path(args), args.id, approve=action == "approve", note=args.note, by=args.by
        )
        out.write(
            f"{a.decision} {a.request} (saga {a.saga_id}, step {a.step}, tool {a.tool}) "
            f"by {a.decided_by}\n"
        )
        return 0
    items = list_approvals(_wal_path(args), include_decided=args.all)
    now = time.time()
    if args.json:
        data = [{**asdict(a), "state": _approval_state(a, now)} for a in items]
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return 0
    if not items:
        out.write("no open approval requests\n")
        return 0
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
    return 0


# ---- placeholders -------------------------------------------------------------------


def _not_yet(name: str) -> Callable[[argparse.Namespace, TextIO, TextIO], int]:
    def handler(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
        err.write(f"agent-saga {name}: {_NOT_YET.format(name)}\n")
        return 2

    return handler


# ---- parser -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Return the ``agent-saga`` argument parser.

    Returns:
        The parser; each subcommand sets ``handler``.
    """
    from .wal.compaction import DEFAULT_RETAIN_SECONDS

    parser = argparse.ArgumentParser(
        prog="agent-saga", description="Inspect and maintain agent-saga write-ahead logs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    runs = sub.add_parser("runs", help="list sagas and their state")
    _add_wal_path(runs)
    runs.add_argument("--status", help="only sagas with this status (e.g. running, committed)")
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
        type=float,
        default=DEFAULT_RETAIN_SECONDS,
        help="keep sagas that ended less than this long ago (default: 7 days)",
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
    compact.add_argument("--json", action="store_true", help="print the report as JSON")
    compact.set_defaults(handler=_cmd_compact)

    encrypt = wal_sub.add_parser(
        "encrypt", help="encrypt a plaintext log and its snapshots in place (AGENT_SAGA_WAL_KEY)"
    )
    _add_wal_path(encrypt)
    encrypt.set_defaults(handler=_cmd_encrypt)

    esc = sub.add_parser("escalations", help="list the human queue, or resolve an item")
    _add_wal_path(esc)
    esc.add_argument("--all", action="store_true", help="include resolved escalations")
    esc.add_argument("--json", action="store_true", help="print one JSON document")
    esc.set_defaults(handler=_cmd_escalations)
    esc_sub = esc.add_subparsers(dest="esc_command", metavar="ACTION")
    resolve = esc_sub.add_parser("resolve", help="record a human's decision on one escalation")
    resolve.add_argument("id", help="the escalation id (esc-...)")
    resolve.add_argument("--note", required=True, help="what was done or decided")
    resolve.add_argument("--by", default=None, help="who decided (default: the OS user)")
    resolve.add_argument("--wal-path", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    retry = esc_sub.add_parser(
        "retry", help="have saga-recoveryd try an escalated step again once its cause is fixed"
    )
    retry.add_argument("id", help="the escalation id (esc-...)")
    retry.add_argument("--note", required=True, help="what was fixed (recorded)")
    retry.add_argument("--by", default=None, help="who asks (default: the OS user)")
    retry.add_argument("--wal-path", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    apr = sub.add_parser("approvals", help="list approval requests, or approve/deny one")
    _add_wal_path(apr)
    apr.add_argument("--all", action="store_true", help="include decided and expired requests")
    apr.add_argument("--json", action="store_true", help="print one JSON document")
    apr.set_defaults(handler=_cmd_approvals)
    apr_sub = apr.add_subparsers(dest="apr_command", metavar="ACTION")
    for action, verb in (("approve", "let the step run"), ("deny", "refuse the step")):
        decide = apr_sub.add_parser(action, help=f"{verb} (recorded durably in the log)")
        decide.add_argument("id", help="the request id (apr-...)")
        decide.add_argument("--note", required=True, help="why; recorded with the decision")
        decide.add_argument("--by", default=None, help="who decided (default: the OS user)")
        decide.add_argument("--wal-path", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    stub = sub.add_parser("ui", help="time-travel debugger (not yet implemented)")
    stub.set_defaults(handler=_not_yet("ui"), accepts_anything=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agent-saga``.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code (0 ok, 1 ``wal verify`` found damage, 2 error).
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "accepts_anything", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse: --help exits 0, usage errors exit 2
        return int(exc.code or 0)
    handler: Callable[[argparse.Namespace, TextIO, TextIO], int] = args.handler
    try:
        return handler(args, sys.stdout, sys.stderr)
    except SagaError as exc:
        sys.stderr.write(f"agent-saga: error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"agent-saga: error: {exc.strerror or exc}: {exc.filename or ''}\n")
        return 2
    except KeyboardInterrupt:
        return 130
