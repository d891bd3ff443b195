"""``saga-recoveryd``: the recovery daemon's command line.

    saga-recoveryd --wal-path PATH [--import MODULE ...] [--once] [--interval S]

``--once`` makes one pass and exits 0 when the pass completed, whatever it
escalated (escalations are listed by ``agent-saga escalations``); exit 2 means
the pass could not run (bad arguments, an import failed, the log cannot be read).
SIGTERM and SIGINT stop the daemon after the step in progress.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from .. import _config
from .._types import RetryPolicy
from ..errors import SagaError
from .daemon import RecoveryDaemon

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="saga-recoveryd",
        description="Finish the sagas of agent processes that died, from the WAL.",
    )
    p.add_argument(
        "--wal-path",
        default=None,
        help="the write-ahead log (default: $AGENT_SAGA_WAL_PATH or ./agent-saga.wal)",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers handlers); repeatable",
    )
    p.add_argument("--once", action="store_true", help="make one pass and exit")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between passes (default 5)")
    p.add_argument(
        "--claim-seconds",
        type=float,
        default=60.0,
        help="how long a claim lasts before another daemon may take over",
    )
    p.add_argument(
        "--retry-attempts",
        type=int,
        default=3,
        help="attempts per compensation before escalating (default 3)",
    )
    p.add_argument(
        "--retry-delay",
        type=float,
        default=0.2,
        help="first backoff between attempts, seconds (default 0.2)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``saga-recoveryd``; return the exit code."""
    args = _parser().parse_args(argv)
    if args.interval <= 0 or args.claim_seconds <= 0 or args.retry_attempts < 1:
        print(
            "saga-recoveryd: error: --interval and --claim-seconds must be > 0, "
            "--retry-attempts >= 1",
            file=sys.stderr,
        )
        return 2
    for module in args.imports:
        try:
            importlib.import_module(module)
        except Exception as exc:
            print(
                f"saga-recoveryd: error: --import {module} failed: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 2
    daemon: RecoveryDaemon | None = None
    try:
        daemon = RecoveryDaemon(
            args.wal_path or _config.default_wal_path(),
            claim_seconds=args.claim_seconds,
            compensation_retry=RetryPolicy(
                attempts=args.retry_attempts, initial_delay=args.retry_delay
            ),
        )
        stopper = daemon.stop
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopper())
        if args.once:
            if not os.path.exists(daemon.wal_path):
                print(
                    f"saga-recoveryd: no WAL at {daemon.wal_path}: nothing to recover",
                    file=sys.stderr,
                )
            report = daemon.run_once()
            if report.escalated:
                print(
                    f"saga-recoveryd: {report.escalated} step(s) escalated to a human; "
                    "see `agent-saga escalations`",
                    file=sys.stderr,
                )
        else:
            daemon.run_forever(args.interval)
    except SagaError as exc:
        print(f"saga-recoveryd: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if daemon is not None:
            daemon.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
