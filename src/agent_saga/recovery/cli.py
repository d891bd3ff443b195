"""``saga-recoveryd``: the recovery daemon's command line.

    saga-recoveryd --wal-path PATH [--import MODULE ...] [--once [--wait[=MAX]]]
                   [--interval S] [--claim-seconds S] [--retry-attempts N]
                   [--retry-delay S] [--lock URL]
                   [--checkpoint-every N] [--checkpoint-seconds S]
    saga-recoveryd --version

A saga is left alone while its owner's lease is live: 30 s by default
(``saga(lease_seconds=...)``), renewed every third of it by the owner. Right after
an agent died, ``--once`` therefore skips its sagas (``skipped-live`` events carry
``lease_expires`` and ``orphaned_in``, and a hint goes to stderr); ``--wait``
waits until those leases (and other daemons' claims) have expired, at most MAX
seconds (default 120), then makes the pass.

``--import`` finds modules in the current directory first, as ``python -m`` does.

``--lock redis://…`` / ``rediss://…`` / ``postgresql://…`` keeps daemons on several
hosts off the same saga (default: a file lock beside the WAL, for one host); a lock
server that is down makes the daemon skip sagas, never fail (docs/recovery.md, "Locks").

Exit codes:

* 0 — the pass completed (``--once``), whatever it escalated: escalations are
  reported on stderr and listed by ``agent-saga escalations``; or the daemon was
  stopped by SIGTERM/SIGINT between passes. A missing WAL file in an existing
  directory is a completed pass with nothing to recover.
* 2 — the pass could not run: bad arguments, a bad ``--wal-path`` (a directory,
  a FIFO, a broken link, unreadable, its directory missing), an ``--import`` that
  failed, an encrypted log without its key, any other expected error.
* 70 — an exception nobody expected: one line, "this is a bug, please report it".
* 130 / 143 — ``--once`` was interrupted by SIGINT / SIGTERM before its pass
  completed (during ``--wait`` or in the middle of the pass): run it again.

With ``AGENT_SAGA_AUDIT_KEY`` set to a signing key, the daemon appends a signed
checkpoint of the log's Merkle tree every ``--checkpoint-every`` records or
``--checkpoint-seconds`` seconds (at the end of a pass); with any key, it escalates
instead of compensating a saga whose records fail a checkpoint (docs/audit.md).

SIGTERM and SIGINT stop the daemon after the step in progress; no traceback is
ever printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, Final

from .. import _config
from .._cli_support import (
    EXIT_BUG,
    EXIT_OK,
    EXIT_USAGE,
    bug_line,
    conflict_message,
    conflicting_distribution,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    version_line,
)
from .._types import RetryPolicy
from ..errors import SagaError
from ..wal.store import open_store
from ._verify import DEFAULT_EVERY, DEFAULT_SECONDS
from .daemon import RecoveryDaemon
from .locks import lock_from_url

__all__ = ["DEFAULT_WAIT_SECONDS", "main"]

PROG: Final = "saga-recoveryd"
DEFAULT_WAIT_SECONDS: Final = 120.0
"""How long ``--once --wait`` waits for leases at most when no MAX is given."""

_EPILOG = """\
leases: an agent's sagas belong to it while its lease is live -- 30 s by default
(saga(lease_seconds=...)), renewed every third of it. Right after an agent died,
--once skips its sagas (skipped-live, with orphaned_in); rerun once the lease
expired, or use --once --wait.

exit codes: 0 the pass completed (escalations included; see `agent-saga
escalations`), 2 the pass could not run, 70 a bug, 130/143 interrupted by
SIGINT/SIGTERM before the pass completed. Reference: docs/recovery.md.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Finish the sagas of agent processes that died, from the WAL.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=version_line())
    p.add_argument(
        "--wal-path",
        default=None,
        metavar="PATH",
        help="the write-ahead log (default: $AGENT_SAGA_WAL_PATH or ./agent-saga.wal)",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers handlers); repeatable; the current "
        "directory is searched first, like `python -m`",
    )
    p.add_argument("--once", action="store_true", help="make one pass and exit")
    p.add_argument(
        "--wait",
        nargs="?",
        type=positive_seconds,
        const=DEFAULT_WAIT_SECONDS,
        default=None,
        metavar="MAX_SECONDS",
        help="with --once: first wait until the leases of the sagas the pass would "
        f"skip have expired, at most MAX_SECONDS (default {DEFAULT_WAIT_SECONDS:g})",
    )
    p.add_argument(
        "--interval",
        type=positive_seconds,
        default=5.0,
        metavar="S",
        help="seconds between passes (default 5)",
    )
    p.add_argument(
        "--claim-seconds",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="how long a claim lasts before another daemon may take over (default 60)",
    )
    p.add_argument(
        "--retry-attempts",
        type=positive_int,
        default=3,
        metavar="N",
        help="attempts per compensation before escalating (default 3)",
    )
    p.add_argument(
        "--retry-delay",
        type=non_negative_seconds,
        default=0.2,
        metavar="S",
        help="first backoff between attempts, seconds (default 0.2)",
    )
    p.add_argument(
        "--lock",
        default=None,
        metavar="URL",
        help="lock shared by daemons on several hosts: redis://host:port/db, rediss://… "
        "or postgresql://… (password: REDISCLI_AUTH / PGPASSWORD or ~/.pgpass; default: "
        "a file lock beside the WAL)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_non_negative_int,
        default=DEFAULT_EVERY,
        metavar="N",
        help="with AGENT_SAGA_AUDIT_KEY: append a signed checkpoint once N records follow "
        f"the last one (default {DEFAULT_EVERY}; 0: by time only)",
    )
    p.add_argument(
        "--checkpoint-seconds",
        type=non_negative_seconds,
        default=DEFAULT_SECONDS,
        metavar="S",
        help="... or once the last one is S seconds old (default "
        f"{DEFAULT_SECONDS:g}; 0: by count only; both 0: no automatic checkpoints)",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        help="trace and measure recoveries with OpenTelemetry, exported over OTLP/HTTP "
        "as the OTEL_* environment variables say (OTEL_EXPORTER_OTLP_ENDPOINT, ...); "
        "needs the otel extra, opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http",
    )
    return p


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


# ---- --import ----------------------------------------------------------------------


def _search_path_for_imports() -> None:
    """Put the working directory first on ``sys.path``, as ``python -m`` does.

    A console script's ``sys.path[0]`` is the script's own directory (``.../bin``),
    so without this ``--import handlers`` would not find ``./handlers.py``.
    """
    try:
        cwd = os.getcwd()
    except OSError:  # the directory was deleted under us: nothing to add
        return
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _shown(entry: str, cwd: str, home: str) -> str:
    if entry in ("", cwd):
        return "."
    if cwd and entry.startswith(cwd + os.sep):
        return "." + entry[len(cwd) :]
    if home and home != os.sep and entry.startswith(home + os.sep):
        return "~" + entry[len(home) :]
    return entry


def _searched() -> str:
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    home = os.path.expanduser("~")
    shown = [_shown(e, cwd, home) for e in sys.path if e == "" or os.path.exists(e)]
    return ", ".join(dict.fromkeys(shown))


def _import_error(module: str, exc: BaseException) -> str:
    """One line saying why ``--import module`` failed and what to do."""
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None:
        wanted = module.split(".")
        if exc.name in {".".join(wanted[: i + 1]) for i in range(len(wanted))}:
            return (
                f"{PROG}: error: --import {module}: no module named {exc.name!r} on the "
                f"import path (searched: {_searched()}); run from the directory that "
                "contains it, or set PYTHONPATH=/path/to/its/parent"
            )
    where = ""
    frames = [f for f in _frames(exc) if "importlib" not in f[0]]
    if frames:
        filename, lineno = frames[-1]
        where = f" at {os.path.basename(filename)}:{lineno}"
    from ..secrets import redact

    text = " ".join(str(redact(str(exc))).split())[:300]
    return (
        f"{PROG}: error: --import {module} failed{where}: {type(exc).__name__}"
        f"{': ' + text if text else ''}"
    )


def _frames(exc: BaseException) -> list[tuple[str, int]]:
    tb = exc.__traceback__
    frames: list[tuple[str, int]] = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _import_modules(modules: Sequence[str]) -> str | None:
    """Import every ``--import`` module; return the error line of the first failure."""
    if modules:
        _search_path_for_imports()
    for module in modules:
        if module.endswith(".py") or os.sep in module or "/" in module:
            stem = os.path.splitext(os.path.basename(module))[0] or module
            return (
                f"{PROG}: error: --import takes a module name, not a file: run from the "
                f"directory that contains {os.path.basename(module)} and pass "
                f"--import {stem} (or a dotted name such as myapp.{stem})"
            )
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as exc:  # the module is the user's code
            return _import_error(module, exc)
    return None


# ---- one pass, and waiting for it ----------------------------------------------------


class _Events:
    """The daemon's event sink: JSON lines on stdout, plus what the hint needs."""

    def __init__(self) -> None:
        self.skipped: dict[str, float | None] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
        sys.stdout.flush()
        if event.get("event") in ("skipped-live", "skipped-unowned"):
            self.skipped[str(event.get("saga"))] = event.get("orphaned_in")

    def hint(self) -> str | None:
        """The stderr hint after a pass that skipped sagas with live owners."""
        if not self.skipped:
            return None
        known = [v for v in self.skipped.values() if v is not None]
        when = f"; their leases expire in up to {_secs(max(known))}" if known else ""
        return (
            f"{PROG}: {len(self.skipped)} saga(s) still owned by a live or recently-dead "
            f"process{when}; rerun then, or use --once --wait"
        )


def _secs(value: float) -> str:
    whole = int(value) + (value > int(value))
    return f"{whole} s"


class _Signals:
    """SIGINT/SIGTERM: remember which arrived and ask the daemon to stop."""

    def __init__(self, daemon: RecoveryDaemon) -> None:
        self.received: int | None = None
        self._daemon = daemon
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        self._daemon.stop()

    def interrupted(self) -> bool:
        """Whether SIGINT or SIGTERM arrived."""
        return self.received is not None

    def exit_code(self) -> int:
        """128 + the signal number."""
        return 128 + (self.received or 0)


def _wait_for_leases(daemon: RecoveryDaemon, max_seconds: float, signals: _Signals) -> None:
    """Sleep until no saga the pass would skip has a live owner, or ``max_seconds``."""
    deadline = time.monotonic() + max_seconds
    announced = False
    while not signals.interrupted():
        waiting = daemon.waiting_for_owners()
        if not waiting:
            return
        known = [v for v in waiting.values() if v is not None]
        left = deadline - time.monotonic()
        if left <= 0:
            print(
                f"{PROG}: waited {max_seconds:g} s; {len(waiting)} saga(s) still have a "
                "live owner (a running agent keeps renewing its lease); making the pass",
                file=sys.stderr,
            )
            return
        if not announced:
            longest = f"up to {_secs(max(known))}" if known else "an unknown time"
            print(
                f"{PROG}: waiting for the leases or claims of {len(waiting)} saga(s) to expire "
                f"({longest}, at most {max_seconds:g} s)",
                file=sys.stderr,
            )
            announced = True
        # Short naps: a signal is honoured within 0.2 s; renewals are re-read.
        nap = min(left, 0.2, max(known) + 0.01 if known else 0.2)
        time.sleep(max(nap, 0.01))


def _run_daemon(args: argparse.Namespace) -> int:
    store = open_store(str(_config.default_wal_path() if args.wal_path is None else args.wal_path))
    store.check(must_exist=False)
    error = _import_modules(args.imports)
    if error is not None:
        print(error, file=sys.stderr)
        return EXIT_USAGE
    shutdown = None
    if args.otel:
        from ..observability._sdk import instrument_from_environment

        shutdown = instrument_from_environment(PROG)
    lock = None if args.lock is None else lock_from_url(args.lock)
    events = _Events()
    daemon = RecoveryDaemon(
        store,
        lock=lock,
        claim_seconds=args.claim_seconds,
        compensation_retry=RetryPolicy(
            attempts=args.retry_attempts, initial_delay=args.retry_delay
        ),
        emit=events,
        checkpoint_every=args.checkpoint_every,
        checkpoint_seconds=args.checkpoint_seconds,
    )
    try:
        signals = _Signals(daemon)
        if not args.once:
            daemon.run_forever(args.interval)
            return EXIT_OK
        if not store.exists():
            print(f"{PROG}: no WAL at {store.display}: nothing to recover", file=sys.stderr)
        elif args.wait is not None:
            _wait_for_leases(daemon, args.wait, signals)
        if signals.interrupted():
            print(f"{PROG}: interrupted before the pass; no saga was touched", file=sys.stderr)
            return signals.exit_code()
        report = daemon.run_once()
        if signals.interrupted():
            print(
                f"{PROG}: interrupted; the pass did not complete (claims expire); rerun",
                file=sys.stderr,
            )
            return signals.exit_code()
        if report.escalated:
            print(
                f"{PROG}: {report.escalated} step(s) escalated to a human; "
                "see `agent-saga escalations`",
                file=sys.stderr,
            )
        hint = events.hint()
        if hint is not None:
            print(hint, file=sys.stderr)
        return EXIT_OK
    finally:
        daemon.close()
        close_lock = getattr(lock, "close", None)
        if close_lock is not None:
            close_lock()
        if shutdown is not None:
            shutdown()  # flush the spans and metrics of the pass


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help/--version exit 0, usage errors exit 2
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.wait is not None and not args.once:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: --wait needs --once", file=sys.stderr)
        return EXIT_USAGE
    other = conflicting_distribution()
    if other is not None:
        print(conflict_message(PROG, other), file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run_daemon(args)
    except SagaError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the environment said no (permissions, disk full, ...)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"{PROG}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``saga-recoveryd``.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code (see the module docstring): 0 the pass completed, 2 it could
        not run, 70 a bug, 130/143 interrupted before the pass completed.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the signal handlers were installed
        return 130
    except Exception as exc:
        print(bug_line(PROG, exc), file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
